/* The control socket: <run dir>/<pid>.sock, one JSON object per line each way,
 * served by one shim thread. Only the process's own user and root are answered
 * (SO_PEERCRED). After fork, the child gets its own socket and thread.
 * An answer may carry a file descriptor (SCM_RIGHTS): ipc_fd's, the shareable
 * handle behind a legacy IPC handle this process gave out (ipc_legacy.c). A
 * request may carry descriptors: arena_attach's, the arena's files filled ahead
 * (arena.c); those a request does not take are closed after its answer. What
 * the lines say is the answerer's (dispatch.c): this file only carries them. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "arena.h"
#include "control.h"
#include "json.h"
#include "log.h"
#include "protocol_keys.h"

#define MAX_LINE 65536 /* nccl_rebuild carries a unique id per communicator */

static char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static int listen_fd = -1;
static pid_t owner_pid;
static int pending_fd = -1; /* sent with the next reply, then closed */
static int req_fds[GPUCR_ARENA_MAX_SEGS]; /* came with the request being read */
static int req_nfds;
static int req_fds_cut; /* more came than fit: the request cannot have them */
static gpucr_answer_fn answer;

int gpucr_control_take_fds(int *out, int max)
{
    if (req_fds_cut || req_nfds > max)
        return -1;
    int n = req_nfds;
    memcpy(out, req_fds, (size_t)n * sizeof(int));
    req_nfds = 0;
    return n;
}

void gpucr_control_reply_fd(int fd)
{
    if (pending_fd >= 0)
        close(pending_fd);
    pending_fd = fd;
}

static void drop_req_fds(void)
{
    for (int i = 0; i < req_nfds; i++)
        close(req_fds[i]);
    req_nfds = 0;
    req_fds_cut = 0;
}

/* recv, keeping the descriptors that come with the bytes (SCM_RIGHTS). */
static ssize_t recv_with_fds(int fd, char *buf, size_t len)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * GPUCR_ARENA_MAX_SEGS)];
    } ctl;
    struct iovec iov = {buf, len};
    struct msghdr msg;
    gpucr_msghdr(&msg, &iov, ctl.b, sizeof ctl.b);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0)
        return n;
    if (msg.msg_flags & MSG_CTRUNC)
        req_fds_cut = 1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        const int *got = (const int *)CMSG_DATA(c);
        for (int i = 0; i < k; i++) {
            if (req_nfds < GPUCR_ARENA_MAX_SEGS)
                req_fds[req_nfds++] = got[i];
            else {
                close(got[i]);
                req_fds_cut = 1;
            }
        }
    }
    return n;
}

const char *gpucr_control_path(void) { return path; }

void gpucr_msghdr(struct msghdr *m, struct iovec *iov, void *ctl, size_t ctl_len)
{
    memset(m, 0, sizeof *m);
    m->msg_iov = iov;
    m->msg_iovlen = 1;
    m->msg_control = ctl;
    m->msg_controllen = ctl_len;
}

int gpucr_run_dir(char *out, size_t len)
{
    const char *d = getenv("GPUCR_RUN_DIR");
    const char *x = getenv("XDG_RUNTIME_DIR");
    int n;
    if (d && *d)
        n = snprintf(out, len, "%s", d);
    else if (x && *x)
        n = snprintf(out, len, "%s/gpucr", x);
    else
        n = snprintf(out, len, "/tmp/gpucr-%u", (unsigned)getuid());
    if (n < 0 || (size_t)n >= len)
        return -1;
    if (mkdir(out, 0700) < 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (lstat(out, &st) < 0 || !S_ISDIR(st.st_mode))
        return -1;
    /* never serve from a directory another user controls */
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        gpucr_log("run dir %s belongs to uid %u: no control socket", out, (unsigned)st.st_uid);
        return -1;
    }
    return 0;
}

static void write_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

/* The first byte goes with the pending descriptor, if any. */
static void send_fd(int fd, const char *buf)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {(void *)buf, 1};
    struct msghdr msg;
    gpucr_msghdr(&msg, &iov, ctl.b, sizeof ctl.b);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pending_fd, sizeof(int));
    while (sendmsg(fd, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
}

static void reply(int fd, struct jbuf *j)
{
    const char *buf = j->buf;
    size_t len = j->len;
    if (pending_fd >= 0 && len > 0) {
        send_fd(fd, buf);
        close(pending_fd);
        pending_fd = -1;
        buf++;
        len--;
    }
    write_all(fd, buf, len);
    write_all(fd, "\n", 1);
}

static void serve(int fd)
{
    struct ucred cred;
    socklen_t clen = sizeof cred;
    struct jbuf out;
    jb_init(&out);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
        (cred.uid != 0 && cred.uid != getuid() && cred.uid != geteuid())) {
        /* take the request first (briefly): closing on an unread request makes
         * the client's send fail with EPIPE before it can read why */
        struct timeval brief = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &brief, sizeof brief);
        char junk[4096];
        ssize_t n;
        for (int k = 0; k < 4 && (n = recv(fd, junk, sizeof junk, 0)) > 0 && !memchr(junk, '\n', (size_t)n); k++)
            ;
        jb_begin(&out);
        jb_bool(&out, KEY_ok, 0);
        jb_str(&out, KEY_error, "permission denied: only the process owner and root may control it");
        jb_end(&out);
        reply(fd, &out);
        jb_free(&out);
        return;
    }
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[MAX_LINE];
    size_t have = 0;
    for (;;) {
        char *nl = memchr(buf, '\n', have);
        if (!nl) {
            if (have == sizeof buf - 1)
                break; /* line too long */
            ssize_t n = recv_with_fds(fd, buf + have, sizeof buf - 1 - have);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            have += (size_t)n;
            continue;
        }
        *nl = 0;
        out.len = 0;
        out.first = 0;
        answer(buf, &out);
        drop_req_fds(); /* before the answer: the client may count them closed */
        reply(fd, &out);
        size_t used = (size_t)(nl - buf) + 1;
        memmove(buf, nl + 1, have - used);
        have -= used;
    }
    drop_req_fds();
    jb_free(&out);
}

static void *server(void *arg)
{
    (void)arg;
    int fd = listen_fd;
    for (;;) {
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            gpucr_log("control socket closed (%s)", strerror(errno));
            return NULL; /* e.g. the program closed all its descriptors */
        }
        serve(c);
        close(c);
    }
}

int gpucr_control_start(gpucr_answer_fn answer_with)
{
    answer = answer_with;
    char dir[sizeof path];
    if (gpucr_run_dir(dir, sizeof dir - 16) < 0)
        return -1;
    int n = snprintf(path, sizeof path, "%s/%d.sock", dir, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof path) {
        path[0] = 0;
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    unlink(path); /* a socket left by an earlier image of this pid (exec) */
    mode_t old = umask(0077);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc < 0 || listen(fd, 8) < 0) {
        gpucr_log("control socket %s: %s", path, strerror(errno));
        close(fd);
        path[0] = 0;
        return -1;
    }
    listen_fd = fd;
    owner_pid = getpid();
    /* the server thread must not receive the program's signals */
    sigset_t all, old_mask;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_mask);
    pthread_t t;
    rc = pthread_create(&t, NULL, server, NULL);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (rc != 0) {
        close(fd);
        unlink(path);
        listen_fd = -1;
        path[0] = 0;
        return -1;
    }
    pthread_setname_np(t, "gpucr-ctl");
    pthread_detach(t);
    return 0;
}

void gpucr_control_stop(void)
{
    if (path[0] && owner_pid == getpid())
        unlink(path);
}

void gpucr_control_after_fork_child(gpucr_answer_fn answer_with)
{
    /* The parent's thread does not exist here; its socket stays the parent's. */
    if (listen_fd >= 0)
        close(listen_fd);
    listen_fd = -1;
    path[0] = 0;
    gpucr_control_start(answer_with);
}
