/* Command stubs so the GPU-independent core links without CUDA in unit tests.
 * For test_tstp: GPUCR_STUB_LOG_FD (a descriptor) gets "checkpoint\n" and
 * "restore\n" as they run; GPUCR_STUB_CKPT_MS makes the checkpoint take that
 * long (noting "start\n" first); GPUCR_STUB_REFUSE makes it answer a refusal;
 * GPUCR_STUB_HELD makes it answer that another checkpoint holds the process, in
 * words of its own (the caller must go by the outcome, not the text). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ipc_legacy.h"
#include "json.h"
#include "nccl_cut.h"
#include "protocol_keys.h"
#include "status.h"

static int checkpointed;

static void note(const char *what)
{
    const char *fd = getenv("GPUCR_STUB_LOG_FD");
    if (fd && *fd)
        (void)!write(atoi(fd), what, strlen(what));
}

void gpucr_cmd_status(struct jbuf *out) { jb_begin(out); jb_bool(out, KEY_ok, 1); jb_end(out); }
static int refuse(struct jbuf *out, int outcome, const char *why)
{
    jb_begin(out);
    jb_bool(out, KEY_ok, 0);
    jb_str(out, KEY_error, why);
    jb_end(out);
    return outcome;
}

int gpucr_cmd_checkpoint(long timeout_ms, struct jbuf *out)
{
    (void)timeout_ms;
    const char *ms = getenv("GPUCR_STUB_CKPT_MS");
    if (getenv("GPUCR_STUB_REFUSE"))
        return refuse(out, GPUCR_FAILED, "checkpoint refused: the process uses managed (UVM) memory (1 allocation), "
                                         "which the driver cannot checkpoint; it keeps running");
    if (getenv("GPUCR_STUB_HELD"))
        return refuse(out, GPUCR_ALREADY_CHECKPOINTED, "its GPU memory is held by the node agent's checkpoint");
    if (ms && *ms)
        note("start\n");
    if (ms && *ms)
        usleep((useconds_t)atol(ms) * 1000);
    checkpointed = 1;
    note("checkpoint\n");
    gpucr_cmd_status(out);
    return GPUCR_DONE;
}
int gpucr_cmd_restore(struct jbuf *out)
{
    if (!checkpointed)
        return refuse(out, GPUCR_NOT_CHECKPOINTED, "nothing is held for this process");
    checkpointed = 0;
    note("restore\n");
    gpucr_cmd_status(out);
    return GPUCR_DONE;
}
void gpucr_cmd_arena_detach(struct jbuf *out) { gpucr_cmd_status(out); }
void gpucr_cmd_staging_drop(struct jbuf *out) { gpucr_cmd_status(out); }
void gpucr_cmd_arena_attach(int linkable, struct jbuf *out) { (void)linkable; gpucr_cmd_status(out); }
void gpucr_cmd_arena_files(const char *line, struct jbuf *out) { (void)line; gpucr_cmd_status(out); }
void gpucr_cmd_prefill(struct jbuf *out) { gpucr_cmd_status(out); }
int gpucr_ipc_export_fd(uint64_t id, uint64_t *size) { (void)id; (void)size; return -1; }
/* nccl_cut.c: no NCCL in unit tests; nccl_counts answers as a process without communicators */
int gpucr_cmd_nccl(const char *cmd, const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line;
    (void)timeout_ms;
    if (strcmp(cmd, "nccl_counts"))
        return 0;
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_str(out, KEY_cut, "none");
    jb_end(out);
    return 1;
}
