/* The copy helper path (GPUCR_COPY_HELPER=SOCKET): the GPU data moves between
 * the GPU and the host arena in another process, `gpucr-hpc copy-helper`.
 *
 * Why: the copy engines reach full speed only from pinned host memory, and
 * pinned memory in this process makes the driver checkpoint slower (datapath.c),
 * so the bounce path copies through a small pinned ring and the CPU, at what
 * the host's memory bandwidth allows. The helper maps the same arena files and
 * keeps them pinned in its own context, which the driver never checkpoints: the
 * copy engines then read and write the arena directly, both ways.
 *
 * Out: each allocation is exported (a POSIX descriptor; the shim creates its
 * allocations exportable, hooks_alloc.c), sent with its arena place; the helper
 * imports it, copies it into the arena and lets go; then the checkpoint
 * releases it as on the bounce path. In: the helper creates the allocations on
 * the same GPUs, starts filling them from the arena and sends them; this
 * process imports them and maps them at their old addresses while the copies
 * run, then waits for them ("in_done"). An imported allocation cannot be
 * exported again (the driver refuses), so the helper keeps its own handle to
 * what it made (PHYS_HELPER_HELD) and the next checkpoint copies through that;
 * when the application frees such an allocation, the helper is told to let go
 * ("forget"), and it lets go of everything when this process goes away. A "prefill" sent while the driver
 * restores this process lets the helper do that beside the driver restore.
 * Either way the data is in the arena whatever the helper does, so any helper
 * failure falls back to the process's own path (copy_engine.c), never loses data.
 *
 * Messages are one JSON object per SOCK_SEQPACKET datagram, descriptors as
 * SCM_RIGHTS; blobs go in batches of BATCH. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "arena.h"
#include "copy_stats.h"
#include "driver.h"
#include "helper.h"
#include "json.h"
#include "log.h"
#include "protocol_keys.h"
#include "table.h"

#define BATCH 64
#define MSG_MAX (64 << 10)
#define MAX_SEGS GPUCR_ARENA_MAX_SEGS

static char why[256]; /* why the last use of the helper failed */
static int sock = -1;
static int enabled = -1; /* GPUCR_COPY_HELPER read once */
static char path[108];
static unsigned sent_gen[MAX_SEGS]; /* the segment generation the helper has, +1 */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    gpucr_log("copy helper: %s", why);
}

const char *gpucr_helper_error(void) { return why[0] ? why : "unknown"; }
const char *gpucr_helper_path(void) { return path; }
int gpucr_helper_connected(void) { return __atomic_load_n(&sock, __ATOMIC_RELAXED) >= 0; }

/* How many arena segments the helper has mapped as they are now. */
int gpucr_helper_segments(void)
{
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int seg = 0; sock >= 0 && seg < gpucr_arena_segments() && seg < MAX_SEGS; seg++) {
        int fd;
        size_t size;
        unsigned gen;
        n += gpucr_arena_segment(seg, &fd, &size, &gen) == 0 && sent_gen[seg] == gen + 1;
    }
    pthread_mutex_unlock(&mu);
    return n;
}

int gpucr_helper_enabled(void)
{
    if (enabled < 0) {
        const char *v = getenv("GPUCR_COPY_HELPER");
        if (v && (strcmp(v, "off") == 0 || strcmp(v, "0") == 0))
            v = NULL; /* the job's own opt-out of a site's copy_helper=on */
        enabled = v && *v && strlen(v) < sizeof path;
        if (enabled) {
            snprintf(path, sizeof path, "%s", v);
            gpucr_phys_on_forget = gpucr_helper_forget;
        } else if (v && *v)
            fprintf(stderr, "gpucr: GPUCR_COPY_HELPER=%s is longer than a socket path may be; not using a copy helper\n", v);
    }
    return enabled;
}

static int connect_helper(void)
{
    if (sock >= 0)
        return 0;
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        fail("cannot connect to %s: %s (is gpucr-hpc copy-helper running?)", path, strerror(errno));
        if (s >= 0)
            close(s);
        return -1;
    }
    sock = s;
    memset(sent_gen, 0, sizeof sent_gen);
    return 0;
}

static void clear_held(struct gpucr_phys *p, void *arg)
{
    (void)arg;
    p->flags &= ~(unsigned)PHYS_HELPER_HELD;
}

/* The helper lets go of everything of a closed connection. Callers hold the
 * table lock. */
static void disconnect(void)
{
    if (sock >= 0)
        close(sock);
    sock = -1;
    gpucr_phys_foreach(clear_held, NULL);
}

static int send_msg(const char *json, const int *fds, int nfds)
{
    struct iovec iov = {.iov_base = (void *)json, .iov_len = strlen(json)};
    char ctl[CMSG_SPACE(sizeof(int) * BATCH)];
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        memset(ctl, 0, sizeof ctl);
        m.msg_control = ctl;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t n;
    do
        n = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)iov.iov_len ? 0 : -1;
}

/* One reply into buf; its descriptors (up to max) into fds, their count into *nfds. */
static int recv_msg(char *buf, size_t len, int *fds, int max, int *nfds)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len - 1};
    char ctl[CMSG_SPACE(sizeof(int) * BATCH)];
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    ssize_t n;
    do
        n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    int got = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (got < max && fds)
                    fds[got++] = fd;
                else
                    close(fd);
            }
        }
    if (nfds)
        *nfds = got;
    else
        for (int i = 0; i < got; i++)
            close(fds[i]);
    return 0;
}

/* Sends json (+ fds) and waits for {"ok": true ...}; the reply in reply. */
static int call(const char *json, const int *fds, int nfds, char *reply, size_t len, int *rfds, int rmax, int *rn)
{
    struct json_value ok;
    if (send_msg(json, fds, nfds) != 0 || recv_msg(reply, len, rfds, rmax, rn) != 0) {
        fail("%s", strerror(errno ? errno : EPIPE));
        disconnect();
        return -1;
    }
    if (json_find(reply, KEY_ok, &ok) != 1 || ok.type != JSON_TRUE) {
        fail("refused: %.200s", reply);
        return -1;
    }
    return 0;
}

/* Adds the helper's step timings in reply ("name_s": seconds) to st's, by name. */
static void add_steps(struct gpucr_copy_stats *st, const char *reply)
{
    struct json_reader r;
    struct json_member m;
    json_reader_init(&r, reply);
    while (json_next(&r, &m) == 1) {
        char name[sizeof st->steps[0].name];
        double s;
        long len = json_string(&m.key, name, sizeof name);
        if (len < 2 || (size_t)len >= sizeof name || strcmp(name + len - 2, "_s") != 0 || json_number(&m.value, &s) != 0)
            continue;
        int i = 0;
        while (i < st->nsteps && strcmp(st->steps[i].name, name) != 0)
            i++;
        if (i == st->nsteps) {
            if (i == (int)(sizeof st->steps / sizeof st->steps[0]))
                continue;
            snprintf(st->steps[i].name, sizeof st->steps[i].name, "%s", name);
            st->steps[i].s = 0;
            st->nsteps++;
        }
        st->steps[i].s += s;
    }
}

/* The helper maps and pins arena segment seg, unless it has it as it is now. */
static int send_segment(int seg, int fd, size_t size, unsigned gen)
{
    char msg[256], reply[1024];
    struct jbuf j;
    if (sent_gen[seg] == gen + 1)
        return 0;
    jb_init_fixed(&j, msg, sizeof msg);
    jb_begin(&j);
    jb_str(&j, KEY_cmd, "segment");
    jb_i64(&j, KEY_seg, seg);
    jb_u64(&j, KEY_size, size);
    jb_u64(&j, KEY_gen, gen);
    jb_end(&j);
    if (call(msg, &fd, 1, reply, sizeof reply, NULL, 0, NULL) != 0)
        return -1;
    sent_gen[seg] = gen + 1;
    return 0;
}

/* The helper has every segment that holds one of the blobs, as it is now. */
static int send_segments(struct gpucr_phys *const *p, size_t n, double *setup_s)
{
    double t0 = gpucr_now();
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int seg, fd;
        size_t off, size;
        unsigned gen;
        if (gpucr_arena_locate(p[i]->host, &seg, &off) != 0 || seg >= MAX_SEGS ||
            gpucr_arena_segment(seg, &fd, &size, &gen) != 0) {
            fail("arena segment %d has no descriptor to share", seg);
            rc = -1;
        } else
            rc = send_segment(seg, fd, size, gen);
    }
    *setup_s += gpucr_now() - t0;
    return rc;
}

/* The UUID of a device, as hex: asked of the driver while the process runs
 * (checkpoint), remembered for the prefill, when the driver holds it. */
#define MAX_DEV 64
static char uuids[MAX_DEV][33];

static const char *uuid_of(int dev, int may_ask)
{
    if (dev < 0 || dev >= MAX_DEV)
        return NULL;
    CUuuid u;
    if (!uuids[dev][0] && may_ask && gpucr_drv.cuDeviceGetUuid_v2 && gpucr_drv.cuDeviceGetUuid_v2(&u, dev) == CUDA_SUCCESS)
        for (int k = 0; k < 16; k++)
            snprintf(uuids[dev] + 2 * k, 3, "%02x", (unsigned char)u.bytes[k]);
    return uuids[dev][0] ? uuids[dev] : NULL;
}

/* At start-up, once the arena exists: the helper maps and pins every segment
 * now, so that no checkpoint pays for it. Seconds taken into *secs. */
int gpucr_helper_share_arena(double *secs)
{
    double t0 = gpucr_now();
    gpucr_table_lock(); /* disconnect() walks the table */
    pthread_mutex_lock(&mu);
    int rc = connect_helper();
    for (int seg = 0; rc == 0 && seg < gpucr_arena_segments() && seg < MAX_SEGS; seg++) {
        int fd;
        size_t size;
        unsigned gen;
        if (gpucr_arena_segment(seg, &fd, &size, &gen) == 0)
            rc = send_segment(seg, fd, size, gen);
    }
    pthread_mutex_unlock(&mu);
    gpucr_table_unlock();
    *secs = gpucr_now() - t0;
    return rc;
}

/* One blob as the helper reads it: [id, size, seg, offset, "device uuid", held]. */
static int put_blob(struct jbuf *j, const struct gpucr_phys *p, int may_ask)
{
    int seg;
    size_t off;
    const char *uuid = uuid_of(p->device, may_ask);
    if (!uuid || gpucr_arena_locate(p->host, &seg, &off) != 0)
        return -1;
    jb_arr_begin(j);
    jb_elem_u64(j, p->vhandle);
    jb_elem_u64(j, p->size);
    jb_elem_i64(j, seg);
    jb_elem_u64(j, off);
    jb_elem_str(j, uuid);
    jb_elem_i64(j, (p->flags & PHYS_HELPER_HELD) != 0);
    jb_arr_end(j);
    return j->overflow ? -1 : 0;
}

/* {"cmd": cmd, "blobs": [blob, ...]} into buf. */
static int blob_list(char *buf, size_t len, const char *cmd, struct gpucr_phys *const *p, size_t n)
{
    struct jbuf j;
    int may_ask = strcmp(cmd, "prefill") != 0;
    jb_init_fixed(&j, buf, len);
    jb_begin(&j);
    jb_str(&j, KEY_cmd, cmd);
    jb_key_arr(&j, KEY_blobs);
    for (size_t i = 0; i < n; i++)
        if (put_blob(&j, p[i], may_ask) != 0) {
            fail("allocation %zu: no device UUID or arena place", i);
            return -1;
        }
    jb_arr_end(&j);
    jb_end(&j);
    return j.overflow ? -1 : 0;
}

/* Tells the helper to let go of its handle of p; no answer is sent back. */
static void forget_locked(struct gpucr_phys *p)
{
    char msg[96];
    struct jbuf j;
    p->flags &= ~(unsigned)PHYS_HELPER_HELD;
    if (sock < 0)
        return; /* a new connection holds nothing */
    jb_init_fixed(&j, msg, sizeof msg);
    jb_begin(&j);
    jb_str(&j, KEY_cmd, "forget");
    jb_u64(&j, KEY_id, p->vhandle);
    jb_end(&j);
    if (send_msg(msg, NULL, 0) != 0)
        disconnect(); /* the helper lets go of everything of a closed connection */
}

void gpucr_helper_forget(struct gpucr_phys *p)
{
    pthread_mutex_lock(&mu);
    forget_locked(p);
    pthread_mutex_unlock(&mu);
}

CUresult gpucr_helper_out(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st)
{
    static char msg[MSG_MAX];
    char reply[1024];
    int fds[BATCH];
    CUresult rc = CUDA_ERROR_NOT_READY;
    double t0 = gpucr_now();
    pthread_mutex_lock(&mu);
    if (connect_helper() != 0 || send_segments(p, n, &st->setup_s) != 0)
        goto out;
    for (size_t b = 0; b < n; b += BATCH) {
        size_t k = n - b < BATCH ? n - b : BATCH, made = 0;
        CUresult r = CUDA_SUCCESS;
        for (size_t i = 0; i < k && r == CUDA_SUCCESS; i++) {
            int fd = -1;
            if (p[b + i]->flags & PHYS_HELPER_HELD)
                continue; /* the helper has its own handle */
            if ((r = gpucr_drv.cuMemExportToShareableHandle(&fd, p[b + i]->rhandle,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) == CUDA_SUCCESS)
                fds[made++] = fd;
        }
        int ok = r == CUDA_SUCCESS && blob_list(msg, sizeof msg, "out", p + b, k) == 0 &&
                 call(msg, fds, (int)made, reply, sizeof reply, NULL, 0, NULL) == 0;
        if (ok)
            add_steps(st, reply);
        for (size_t i = 0; i < made; i++)
            close(fds[i]);
        if (ok) /* the helper let go of its handles of these */
            for (size_t i = 0; i < k; i++)
                p[b + i]->flags &= ~(unsigned)PHYS_HELPER_HELD;
        if (!ok) {
            if (r != CUDA_SUCCESS)
                fail("exporting an allocation failed (CUDA error %d)", (int)r);
            goto out;
        }
    }
    rc = CUDA_SUCCESS;
out:
    pthread_mutex_unlock(&mu);
    st->seconds = gpucr_now() - t0;
    st->bounce = 0;
    st->threads = 0;
    return rc;
}

int gpucr_helper_prefill(struct gpucr_phys *const *p, size_t n)
{
    static char msg[MSG_MAX];
    char reply[1024];
    pthread_mutex_lock(&mu);
    int rc = connect_helper();
    for (size_t b = 0; rc == 0 && b < n; b += BATCH) {
        size_t k = n - b < BATCH ? n - b : BATCH;
        rc = blob_list(msg, sizeof msg, "prefill", p + b, k) == 0 ? call(msg, NULL, 0, reply, sizeof reply, NULL, 0, NULL) : -1;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Asks the helper to let go of (keep 0) or keep (keep 1) the allocations it
 * handed over since the last call; it answers once their copies are done, with
 * their outcome. */
static int in_done(int keep, struct gpucr_copy_stats *st)
{
    char msg[64], reply[1024];
    struct jbuf j;
    jb_init_fixed(&j, msg, sizeof msg);
    jb_begin(&j);
    jb_str(&j, KEY_cmd, "in_done");
    jb_bool(&j, KEY_keep, keep);
    jb_end(&j);
    if (call(msg, NULL, 0, reply, sizeof reply, NULL, 0, NULL) != 0)
        return -1;
    add_steps(st, reply);
    return 0;
}

/* The helper makes the allocations and starts filling them; this process
 * imports them (p[i]->rhandle, p[i]->dropped = PHYS_REFILLING) while the copies run, so the
 * caller can map them meanwhile. On success the caller must then call
 * gpucr_helper_in_wait(), which ends the exchange (the helper lock is held
 * until then, so nothing else talks to the helper in between). On failure
 * the helper has let go, and what was imported already (PHYS_REFILLING) is the
 * caller's to release, as after a failed gpucr_helper_in_wait(). */
CUresult gpucr_helper_in(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st)
{
    static char msg[MSG_MAX];
    char reply[1024];
    int fds[BATCH], got = 0;
    double t0 = gpucr_now();
    pthread_mutex_lock(&mu);
    if (connect_helper() != 0 || send_segments(p, n, &st->setup_s) != 0)
        goto fail;
    for (size_t b = 0; b < n; b += BATCH) {
        size_t k = n - b < BATCH ? n - b : BATCH;
        if (blob_list(msg, sizeof msg, "in", p + b, k) != 0 ||
            call(msg, NULL, 0, reply, sizeof reply, fds, BATCH, &got) != 0)
            goto undo;
        add_steps(st, reply);
        CUresult r = got == (int)k ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
        for (int i = 0; i < got; i++) {
            CUmemGenericAllocationHandle h;
            if (r == CUDA_SUCCESS &&
                (r = gpucr_drv.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fds[i],
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) == CUDA_SUCCESS) {
                p[b + i]->rhandle = h;
                p[b + i]->dropped = PHYS_REFILLING;
            }
            close(fds[i]);
        }
        if (r != CUDA_SUCCESS) {
            fail("importing an allocation failed (CUDA error %d)", (int)r);
            goto undo;
        }
    }
    st->seconds = gpucr_now() - t0;
    st->bounce = 0;
    st->threads = 0;
    return CUDA_SUCCESS; /* mu stays held: gpucr_helper_in_wait() */
undo:
    if (sock >= 0)
        in_done(0, st); /* the helper drops what it made (after its copies) */
fail:
    pthread_mutex_unlock(&mu);
    st->seconds = gpucr_now() - t0;
    return CUDA_ERROR_NOT_READY;
}

/* Waits for the copies gpucr_helper_in() started. keep 1: the caller mapped
 * the allocations, the helper keeps its handles of them (PHYS_HELPER_HELD);
 * keep 0: the caller gives up, the helper lets go. Either way a failure (a
 * copy failed, the helper went away) leaves the imports to the caller to
 * release; the data is still in the arena. */
CUresult gpucr_helper_in_wait(struct gpucr_phys *const *p, size_t n, int keep, struct gpucr_copy_stats *st)
{
    double t0 = gpucr_now();
    int rc = in_done(keep, st);
    if (rc == 0 && keep)
        for (size_t i = 0; i < n; i++)
            p[i]->flags |= PHYS_HELPER_HELD;
    pthread_mutex_unlock(&mu);
    st->seconds += gpucr_now() - t0;
    return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

extern char **environ;

static int connected(void)
{
    pthread_mutex_lock(&mu);
    int rc = connect_helper();
    pthread_mutex_unlock(&mu);
    return rc == 0;
}

/* GPUCR_COPY_HELPER_START=CMD (Slurm jobs: the plugin's cli=): when no helper
 * serves at the socket, `CMD copy-helper --ensure` starts one in its own
 * session unless another rank of this node just did. sh runs it in the
 * background and exits at once, so nothing of it stays in this process's
 * tree (which CRIU dumps). Waits up to timeout_s for the helper to listen;
 * 0 once connected. No CUDA call. */
int gpucr_helper_start(double timeout_s)
{
    if (!gpucr_helper_enabled())
        return -1;
    if (connected())
        return 0;
    const char *cmd = getenv("GPUCR_COPY_HELPER_START");
    if (!cmd || !*cmd)
        return -1; /* why says: cannot connect */
    const char *idle = getenv("GPUCR_COPY_HELPER_IDLE");
    char *argv[] = {"/bin/sh", "-c", "\"$0\" copy-helper --ensure --socket \"$1\" --idle-exit \"$2\" </dev/null &",
                    (char *)cmd, path, (char *)(idle && *idle ? idle : "600"), NULL};
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 2, sizeof *envp), **e = envp;
    if (!envp)
        return -1;
    *e++ = "GPUCR_DISABLE=1"; /* the shim is inert in the CLI (and the helper drops it) */
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "GPUCR_DISABLE=", 14) != 0)
            *e++ = environ[i];
    pid_t pid;
    int rc = posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, envp);
    free(envp);
    if (rc != 0) {
        fail("cannot start %s copy-helper: %s", cmd, strerror(rc));
        return -1;
    }
    waitpid(pid, NULL, 0); /* sh only: the CLI runs on in the background */
    for (double t0 = gpucr_now(); gpucr_now() - t0 < timeout_s; usleep(100000))
        if (connected())
            return 0;
    fail("the copy helper started by %s did not listen at %s within %.0f s (its log: %s.log)", cmd, path, timeout_s, path);
    return -1;
}

void gpucr_helper_disconnect(void)
{
    gpucr_table_lock();
    pthread_mutex_lock(&mu);
    disconnect();
    pthread_mutex_unlock(&mu);
    gpucr_table_unlock();
}

void gpucr_helper_after_fork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    if (sock >= 0)
        close(sock); /* the parent's connection */
    sock = -1;
}
