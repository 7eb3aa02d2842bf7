/* The control socket's requests, each answered by its handler; the command
 * table comes from protocol.h's lists of them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "control.h"
#include "dispatch.h"
#include "ipc_legacy.h"
#include "json.h"
#include "nccl_cut.h"
#include "protocol.h"
#include "protocol_keys.h"
#include "status.h"
#include "suspend.h"

struct cmd_ctx {
    const struct gpucr_req *req;
    const char *line; /* the whole request, for fields only one command reads */
};

static void do_ping(const struct cmd_ctx *c, struct jbuf *out)
{
    (void)c;
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_i64(out, KEY_pid, getpid());
    jb_end(out);
}

static void do_status(const struct cmd_ctx *c, struct jbuf *out)
{
    (void)c;
    gpucr_cmd_status(out);
}

static void do_checkpoint(const struct cmd_ctx *c, struct jbuf *out)
{
    long t = c->req->timeout_ms;
    if (t < 0) {
        const char *e = getenv("GPUCR_QUIESCE_TIMEOUT_MS");
        t = e ? atol(e) : 10000;
    }
    gpucr_cmd_checkpoint(t, out);
}

static void do_restore(const struct cmd_ctx *c, struct jbuf *out)
{
    (void)c;
    gpucr_cmd_restore(out);
}

static void do_arena_detach(const struct cmd_ctx *c, struct jbuf *out)
{
    (void)c;
    gpucr_cmd_arena_detach(out);
}

static void do_arena_files(const struct cmd_ctx *c, struct jbuf *out) { gpucr_cmd_arena_files(c->line, out); }

static void do_staging_drop(const struct cmd_ctx *c, struct jbuf *out)
{
    (void)c;
    gpucr_cmd_staging_drop(out);
}

static void do_prefill(const struct cmd_ctx *c, struct jbuf *out)
{
    (void)c;
    gpucr_cmd_prefill(out);
}

static void do_arena_attach(const struct cmd_ctx *c, struct jbuf *out) { gpucr_cmd_arena_attach(c->req->linkable, out); }

static void do_ipc_fd(const struct cmd_ctx *c, struct jbuf *out)
{
    uint64_t size = 0;
    int fd = gpucr_ipc_export_fd(c->req->id, &size);
    jb_begin(out);
    jb_bool(out, KEY_ok, fd >= 0);
    if (fd >= 0) {
        jb_u64(out, KEY_size, size);
        gpucr_control_reply_fd(fd);
    } else {
        jb_str(out, KEY_error, "no such IPC export in this process");
    }
    jb_end(out);
}

static void do_nccl(const struct cmd_ctx *c, struct jbuf *out)
{
    gpucr_cmd_nccl(c->req->cmd, c->line, c->req->timeout_ms, out); /* the cut and the communicators */
}

/* Every request the socket takes (protocol.h); serialized: under gpucr_cmd_mu,
 * against a yield on SIGTSTP (suspend.c). */
static const struct command {
    const char *name;
    void (*run)(const struct cmd_ctx *, struct jbuf *);
    int serialized;
} commands[] = {
#define GPUCR_COMMAND(name, serialized) {#name, do_##name, serialized},
    GPUCR_COMMANDS(GPUCR_COMMAND)
#undef GPUCR_COMMAND
#define GPUCR_NCCL_COMMAND(name) {#name, do_nccl, 0},
    GPUCR_NCCL_COMMANDS(GPUCR_NCCL_COMMAND)
#undef GPUCR_NCCL_COMMAND
};

static void refuse(struct jbuf *out, const char *why)
{
    jb_begin(out);
    jb_bool(out, KEY_ok, 0);
    jb_str(out, KEY_error, why);
    jb_end(out);
}

void gpucr_dispatch(const char *line, struct jbuf *out)
{
    struct gpucr_req req;
    if (gpucr_req_parse(line, &req) < 0)
        return refuse(out, "bad request: expected one JSON object with a \"cmd\" per line");
    const struct cmd_ctx c = {&req, line};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(req.cmd, commands[i].name))
            continue;
        if (commands[i].serialized)
            pthread_mutex_lock(&gpucr_cmd_mu);
        commands[i].run(&c, out);
        if (commands[i].serialized)
            pthread_mutex_unlock(&gpucr_cmd_mu);
        return;
    }
    refuse(out, "unknown command");
}
