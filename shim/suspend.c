/* VRAM yield on a plain suspend: Slurm's `scontrol suspend`
 * sends SIGTSTP, then SIGSTOP about 2 s later; resume sends SIGCONT.
 *
 * Once the process uses CUDA (gpucr_tstp_install, called when the driver is
 * loaded), and only when the program left both SIGTSTP and SIGCONT at SIG_DFL,
 * the shim handles them. A program that installs its own handler later simply
 * replaces ours: the shim never overrides a handler of the program.
 *
 * The handlers only write one byte to a pipe (async-signal-safe); a shim thread
 * with every signal blocked serves it:
 *   T: the in-place data checkpoint (the control socket's "checkpoint": quiesce,
 *      data into the host arena, physical memory released, addresses kept),
 *      then the process stops itself (SIGSTOP) unless a SIGCONT already came,
 *      so SIGTSTP still stops it. When it runs again, the data is restored
 *      before the gate reopens.
 *   C: restore, if a yield is still outstanding.
 * A yield that took longer than GPUCR_TSTP_GRACE_MS (default 2000, Slurm's gap
 * between SIGTSTP and SIGSTOP) or that was overtaken by SIGCONT is reported
 * with one line on stderr (the job's output); so is a refusal (managed memory,
 * IPC, MPS), after which the process just stops. Success is silent unless
 * GPUCR_VERBOSE is set. GPUCR_YIELD_ON_TSTP=0 turns all of this off. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "checkpoint.h"
#include "json.h"
#include "log.h"
#include "protocol_keys.h"
#include "suspend.h"

#ifndef GPUCR_YIELD_ON_TSTP_DEFAULT
#define GPUCR_YIELD_ON_TSTP_DEFAULT 1 /* GPUCR_YIELD_ON_TSTP unset or empty */
#endif

pthread_mutex_t gpucr_cmd_mu = PTHREAD_MUTEX_INITIALIZER;

static int pipe_r = -1, pipe_w = -1;
static volatile pid_t owner; /* the process whose thread serves the pipe */
static volatile sig_atomic_t cont_gen; /* SIGCONTs seen */
static int installed;
static int yielded; /* our checkpoint is outstanding */

static int env_on(const char *var, int dflt)
{
    const char *v = getenv(var);
    if (!v || !*v)
        return dflt;
    return !(strcmp(v, "0") == 0 || strcmp(v, "no") == 0 || strcmp(v, "off") == 0);
}

static void put_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void put_line(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    for (ssize_t off = 0, w; off < n; off += w)
        if ((w = write(2, line + off, (size_t)(n - off))) <= 0 && errno != EINTR)
            return;
        else if (w < 0)
            w = 0;
}

/* ---- handlers: async-signal-safe ---------------------------------------- */

static void on_tstp(int sig)
{
    int saved = errno;
    if (getpid() != owner) { /* a forked child before its fork handler ran */
        signal(sig, SIG_DFL);
        raise(sig);
    } else {
        char b = 'T';
        (void)!write(pipe_w, &b, 1);
    }
    errno = saved;
}

static void on_cont(int sig)
{
    (void)sig;
    int saved = errno;
    if (getpid() == owner) {
        cont_gen++;
        char b = 'C';
        (void)!write(pipe_w, &b, 1);
    }
    errno = saved;
}

/* ---- the thread ------------------------------------------------------------ */

/* Stops the whole process and returns once it runs again. Directed at this
 * thread: a process-directed SIGSTOP is taken by another thread, and this one
 * would run on for a moment before the group stop reaches it. */
static void stop_self(void)
{
    syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), SIGSTOP);
}

/* "error":"..." of a reply, cut at the first ';' (the rest says "it keeps running"). */
static void reply_error(const struct jbuf *j, char *why, size_t len)
{
    struct json_value e;
    if (!j->buf || json_find(j->buf, KEY_error, &e) != 1 || json_string(&e, why, len) < 0)
        snprintf(why, len, "%s", "unknown error");
    char *end = strpbrk(why, ";\"");
    if (end)
        *end = 0;
}

static void restore_now(void)
{
    struct jbuf out;
    jb_init(&out);
    double t0 = gpucr_now();
    int said = 0;
    while (yielded) {
        out.len = 0;
        out.first = 0;
        pthread_mutex_lock(&gpucr_cmd_mu);
        int done = gpucr_cmd_restore(&out);
        pthread_mutex_unlock(&gpucr_cmd_mu);
        if (done == GPUCR_DONE || done == GPUCR_NOT_CHECKPOINTED) { /* or restored via the socket */
            yielded = 0;
            if (env_on("GPUCR_VERBOSE", 0))
                put_line("gpucr: GPU memory restored on resume in %.2f s", gpucr_now() - t0);
            if (said)
                put_line("gpucr: GPU memory restored on resume after %.1f s", gpucr_now() - t0);
            break;
        }
        if (!said) {
            char why[256];
            reply_error(&out, why, sizeof why);
            put_line("gpucr: restoring GPU memory on resume failed (%s); the process waits and retries every second", why);
            said = 1;
        }
        sleep(1);
    }
    jb_free(&out);
}

/* Whether a SIGCONT came since gen0. The kernel continues the process when
 * SIGCONT is sent, but our handler runs only once some thread takes it: until
 * then it is pending, and a yield that ends meanwhile must not stop again
 * (nothing would continue it). A thread may also have taken it and not yet run
 * the handler (it was descheduled in between): give such a handler a moment. */
#define RESUME_SETTLE_US 50000
static int resumed_since(sig_atomic_t gen0)
{
    for (int waited = 0;; waited += 1000) {
        sigset_t pending;
        if (cont_gen != gen0)
            return 1;
        if (sigpending(&pending) == 0 && sigismember(&pending, SIGCONT))
            return 1;
        if (waited >= RESUME_SETTLE_US)
            return 0;
        usleep(1000);
    }
}

static void do_yield(void)
{
    if (yielded) { /* a second SIGTSTP while still yielded: just stop */
        stop_self();
        restore_now();
        return;
    }
    const char *g = getenv("GPUCR_TSTP_GRACE_MS");
    long grace = g && *g ? atol(g) : 2000;
    const char *q = getenv("GPUCR_QUIESCE_TIMEOUT_MS");
    long quiesce = q && *q ? atol(q) : 10000;
    sig_atomic_t gen0 = cont_gen;
    struct jbuf out;
    jb_init(&out);
    double t0 = gpucr_now();
    pthread_mutex_lock(&gpucr_cmd_mu);
    int done = gpucr_cmd_checkpoint(quiesce, &out);
    pthread_mutex_unlock(&gpucr_cmd_mu);
    double took = gpucr_now() - t0;
    int resumed = resumed_since(gen0);
    if (done == GPUCR_DONE) {
        yielded = 1;
        if (resumed)
            put_line("gpucr: VRAM yield on suspend did not finish within %.1f s (took %.1f s, resumed before it ended); "
                     "the GPU memory stayed allocated while suspended", grace / 1000.0, took);
        else if (took * 1000 > grace)
            put_line("gpucr: VRAM yield on suspend did not finish within %.1f s (took %.1f s); the GPU memory stayed "
                     "allocated until it finished, part of the time the process was suspended", grace / 1000.0, took);
        else if (env_on("GPUCR_VERBOSE", 0))
            put_line("gpucr: GPU memory yielded on suspend in %.2f s", took);
    } else if (done != GPUCR_ALREADY_CHECKPOINTED) { /* else: `gpucr-hpc suspend` did it: stay out of it */
        char why[256];
        reply_error(&out, why, sizeof why);
        put_line("gpucr: GPU memory not yielded on suspend: %s; the process is suspended with its GPU memory allocated", why);
    }
    jb_free(&out);
    if (!resumed) /* SIGTSTP stops; Slurm's SIGSTOP may already have come and gone */
        stop_self();
    /* running again: after SIGCONT (or it came while the yield ran) */
    restore_now();
}

static void *tstp_thread(void *arg)
{
    int fd = (int)(intptr_t)arg;
    for (;;) {
        char b;
        ssize_t n = read(fd, &b, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
        if (b == 'T')
            do_yield();
        else if (b == 'C')
            restore_now();
    }
}

/* ---- install / fork ----------------------------------------------------------- */

static int is_default(int sig)
{
    struct sigaction sa;
    return sigaction(sig, NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_DFL;
}

static int ours(int sig, void (*h)(int))
{
    struct sigaction sa;
    return sigaction(sig, NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == h;
}

int gpucr_tstp_install(void)
{
    if (installed && owner == getpid())
        return 1;
    if (!env_on("GPUCR_YIELD_ON_TSTP", GPUCR_YIELD_ON_TSTP_DEFAULT))
        return 0;
    if (!is_default(SIGTSTP) || !is_default(SIGCONT)) {
        gpucr_log("SIGTSTP/SIGCONT handled by the program: no VRAM yield on suspend");
        return 0;
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    fcntl(p[1], F_SETFL, O_NONBLOCK); /* a handler never blocks; a full pipe drops the byte */
    owner = getpid();
    pipe_r = p[0];
    pipe_w = p[1];
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int rc = pthread_create(&t, NULL, tstp_thread, (void *)(intptr_t)pipe_r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        close(p[0]);
        close(p[1]);
        pipe_r = pipe_w = -1;
        return -1;
    }
    pthread_setname_np(t, "gpucr-tstp");
    pthread_detach(t);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_cont;
    sigaction(SIGCONT, &sa, NULL);
    sa.sa_handler = on_tstp;
    sigaction(SIGTSTP, &sa, NULL);
    installed = 1;
    gpucr_log("VRAM yield on SIGTSTP installed");
    return 1;
}

int gpucr_tstp_installed(void) { return installed && owner == getpid() && ours(SIGTSTP, on_tstp); }

void gpucr_tstp_after_fork_child(void)
{
    /* the serving thread is the parent's: back to the default stop */
    if (!installed)
        return;
    if (ours(SIGTSTP, on_tstp))
        signal(SIGTSTP, SIG_DFL);
    if (ours(SIGCONT, on_cont))
        signal(SIGCONT, SIG_DFL);
    if (pipe_r >= 0)
        close(pipe_r);
    if (pipe_w >= 0)
        close(pipe_w);
    pipe_r = pipe_w = -1;
    installed = 0;
    yielded = 0;
    pthread_mutex_init(&gpucr_cmd_mu, NULL);
}
