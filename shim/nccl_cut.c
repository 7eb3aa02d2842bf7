/* A consistent cut of a process's NCCL operations, and its communicators torn
 * down for a checkpoint and rebuilt after the restore.
 *
 * The agents drive it over the control socket, across every rank of the job:
 *   nccl_freeze   no operation starts (each parks at its hook); the counts;
 *   nccl_targets  each communicator's target, the largest count over its ranks:
 *                 a rank behind runs on until every one of its communicators has
 *                 reached its target, then parks at its next operation; a rank
 *                 that passed a target is reported and the agents raise it;
 *   nccl_park     once every rank is settled (counts equal targets, no group
 *                 open): from now on only a thaw or the teardown moves it;
 *   nccl_teardown every communicator finalized and destroyed in creation order,
 *                 which gives back the GPU memory NCCL shared with the peers;
 *                 the ordinary checkpoint runs after it;
 *   nccl_ids      after the restore, a fresh unique id from each communicator's
 *                 rank 0, handed by the agents to every rank;
 *   nccl_rebuild  every communicator made anew (same size, rank, config) in
 *                 creation order, registrations replayed; the parked operations
 *                 go on against the new ones;
 *   nccl_thaw     leaves a cut that is not torn down (a checkpoint given up).
 * Every count is taken at a hook, under gpucr_nccl_mu, so a frozen count cannot
 * move except inside a group that was open at the freeze. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"
#include "hooks_vmm.h"
#include "json.h"
#include "log.h"
#include "nccl_api.h"
#include "nccl_comms.h"
#include "nccl_cut.h"
#include "nccl_finalize.h"
#include "nccl_lib.h"
#include "protocol.h"
#include "protocol_keys.h"

static const char *const cut_names[] = {"none", "frozen", "to_targets", "parked", "torn_down"}; /* gpucr_cut's */

static void *real_pncclCommFinalize, *real_pncclCommDestroy, *real_pncclCommAbort, *real_pncclGetUniqueId,
    *real_pncclCommInitRank,
    *real_pncclCommInitRankConfig, *real_pncclCommRegister, *real_pncclCommGetAsyncError, *real_pncclCommCount,
    *real_pncclCommUserRank;
#define REAL(pname, type) ((type)gpucr_nccl_real(&real_##pname, #pname))
typedef ncclResult_t (*comm_fn)(ncclComm_t);

static int live(const struct gpucr_vcomm *vc) { return !vc->ended; }

static size_t live_count(void)
{
    size_t n = 0;
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next)
        n += live(vc);
    return n;
}

/* A split's size and rank are known once it is ready: asked before they count. */
static void learn_sizes(void)
{
    typedef ncclResult_t (*int_fn)(ncclComm_t, int *);
    int_fn count = REAL(pncclCommCount, int_fn), user_rank = REAL(pncclCommUserRank, int_fn);
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next)
        if (live(vc) && vc->nranks == 0 && vc->real && count && user_rank) {
            int n = 0, r = 0;
            if (count(vc->real, &n) == GPUCR_NCCL_SUCCESS && user_rank(vc->real, &r) == GPUCR_NCCL_SUCCESS) {
                vc->nranks = n;
                vc->rank = r;
            }
        }
}

static int settled(void)
{
    if (gpucr_cut != CUT_TO_TARGETS || gpucr_nccl_in_group)
        return 0;
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next)
        if (live(vc) && vc->ops != vc->target)
            return 0;
    return 1;
}

static const char *unrestorable(char *why, size_t len);

/* What the agents need, under gpucr_nccl_mu: each live communicator as
 * "key:ops:rank:nranks" (key in hex). */
static void put_state(struct jbuf *out)
{
    jb_str(out, KEY_cut, cut_names[gpucr_cut]);
    jb_bool(out, KEY_quiet, gpucr_nccl_in_group == 0);
    jb_bool(out, KEY_settled, settled());
    char why[256];
    if (unrestorable(why, sizeof why))
        jb_str(out, KEY_unrestorable, why);
    jb_key_arr(out, KEY_comms);
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next) {
        if (!live(vc))
            continue;
        char s[96];
        snprintf(s, sizeof s, "%016llx:%llu:%d:%d", (unsigned long long)vc->key, (unsigned long long)vc->ops, vc->rank,
                 vc->nranks);
        jb_elem_str(out, s);
    }
    jb_arr_end(out);
}

void gpucr_nccl_status(struct jbuf *out)
{
    pthread_mutex_lock(&gpucr_nccl_mu);
    jb_u64(out, KEY_nccl_comms, live_count());
    jb_str(out, KEY_nccl_cut, cut_names[gpucr_cut]);
    pthread_mutex_unlock(&gpucr_nccl_mu);
}

/* Why a checkpoint must refuse this process's communicators, or NULL. Under
 * gpucr_nccl_mu. */
static const char *unrestorable(char *why, size_t len)
{
    if (gpucr_nccl_foreign) {
        snprintf(why, len, "the process gave %s an NCCL communicator the gpucr shim did not see made",
                 gpucr_nccl_foreign);
        return why;
    }
    if (__atomic_load_n(&gpucr_multicast, __ATOMIC_RELAXED)) {
        snprintf(why, len, "the process uses NVLink multicast (NVLS), which cannot be made again at a restore "
                           "(NCCL_NVLS_ENABLE=0 keeps NCCL from using it)");
        return why;
    }
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next)
        if (live(vc) && vc->unrestorable) {
            snprintf(why, len, "an NCCL communicator of the process cannot be rebuilt: %s", vc->unrestorable);
            return why;
        }
    return NULL;
}

/* checkpoint.c: a process whose communicators are still there is not checkpointed. */
int gpucr_nccl_refusal(char *why, size_t len)
{
    pthread_mutex_lock(&gpucr_nccl_mu);
    size_t n = 0;
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next)
        n += live(vc) && vc->real;
    int refuse = n > 0 || (gpucr_nccl_foreign && gpucr_cut != CUT_TORN_DOWN);
    pthread_mutex_unlock(&gpucr_nccl_mu);
    if (refuse)
        snprintf(why, len, "checkpoint refused: the process has %zu NCCL communicator%s that must be brought to a "
                 "consistent cut and torn down first, which gpucr-hpc's checkpoint, preempt and suspend do for all "
                 "ranks together; it keeps running", n, n == 1 ? "" : "s");
    return refuse;
}

/* ---- the requests ------------------------------------------------------- */

static void reply_error(struct jbuf *out, const char *reason, const char *msg)
{
    jb_begin(out);
    jb_bool(out, KEY_ok, 0);
    jb_str(out, KEY_reason, reason);
    jb_str(out, KEY_error, msg);
    pthread_mutex_lock(&gpucr_nccl_mu);
    put_state(out);
    pthread_mutex_unlock(&gpucr_nccl_mu);
    jb_end(out);
}

static void reply_state(struct jbuf *out)
{
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    pthread_mutex_lock(&gpucr_nccl_mu);
    put_state(out);
    pthread_mutex_unlock(&gpucr_nccl_mu);
    jb_end(out);
}

/* "key=value,key=value" of a request: the value for key, or NULL. */
static const char *field_for(const char *list, uint64_t key, char *val, size_t len)
{
    char want[24];
    snprintf(want, sizeof want, "%016llx=", (unsigned long long)key);
    const char *p = list;
    while (p && *p) {
        if (!strncmp(p, want, strlen(want))) {
            p += strlen(want);
            size_t n = strcspn(p, ",");
            if (n >= len)
                return NULL;
            memcpy(val, p, n);
            val[n] = 0;
            return val;
        }
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
    return NULL;
}

static char *string_member(const char *line, const char *key)
{
    struct json_value v;
    if (json_find(line, key, &v) != 1 || v.type != JSON_STRING)
        return NULL;
    char *s = malloc(v.len + 1);
    if (s && json_string(&v, s, v.len + 1) < 0) {
        free(s);
        return NULL;
    }
    return s;
}

static void cmd_nccl_freeze(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line, (void)timeout_ms;
    pthread_mutex_lock(&gpucr_nccl_mu);
    if (gpucr_cut == CUT_NONE)
        gpucr_cut = CUT_FROZEN;
    learn_sizes();
    pthread_mutex_unlock(&gpucr_nccl_mu);
    reply_state(out);
}

static void cmd_nccl_targets(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)timeout_ms;
    char *list = string_member(line, KEY_targets);
    if (!list)
        return reply_error(out, "bad_request", "nccl_targets needs \"targets\": \"key=count,...\"");
    pthread_mutex_lock(&gpucr_nccl_mu);
    if (gpucr_cut != CUT_FROZEN && gpucr_cut != CUT_TO_TARGETS) {
        pthread_mutex_unlock(&gpucr_nccl_mu);
        free(list);
        return reply_error(out, "not_frozen", "nccl_targets: the process is not frozen (freeze it first)");
    }
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next) {
        char val[32];
        if (live(vc))
            vc->target = field_for(list, vc->key, val, sizeof val) ? strtoull(val, NULL, 10) : vc->ops;
    }
    gpucr_cut = CUT_TO_TARGETS;
    pthread_cond_broadcast(&gpucr_nccl_cv);
    pthread_mutex_unlock(&gpucr_nccl_mu);
    free(list);
    reply_state(out);
}

static void cmd_nccl_park(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line, (void)timeout_ms;
    pthread_mutex_lock(&gpucr_nccl_mu);
    int ok = settled();
    if (ok)
        gpucr_cut = CUT_PARKED;
    pthread_mutex_unlock(&gpucr_nccl_mu);
    if (!ok)
        return reply_error(out, "not_settled", "nccl_park: the process has not settled at its targets");
    reply_state(out);
}

static void cmd_nccl_thaw(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line, (void)timeout_ms;
    pthread_mutex_lock(&gpucr_nccl_mu);
    int torn = gpucr_cut == CUT_TORN_DOWN;
    if (!torn) {
        gpucr_cut = CUT_NONE;
        pthread_cond_broadcast(&gpucr_nccl_cv);
    }
    pthread_mutex_unlock(&gpucr_nccl_mu);
    if (torn)
        return reply_error(out, "torn_down", "nccl_thaw: the communicators are torn down: rebuild them");
    reply_state(out);
}

static int wait_idle(long timeout_ms)
{
    struct timespec dl = gpucr_deadline_in(timeout_ms);
    while (gpucr_nccl_inflight > 0)
        if (pthread_cond_timedwait(&gpucr_nccl_cv, &gpucr_nccl_mu, &dl) != 0 && gpucr_nccl_inflight > 0)
            return -1;
    return 0;
}

/* Every live communicator's real one, in creation order; *n of them (NULL: none or no memory). */
static ncclComm_t *live_reals(size_t *n)
{
    size_t k = 0;
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next)
        k += live(vc) && vc->real;
    ncclComm_t *out = calloc(k ? k : 1, sizeof *out);
    *n = 0;
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); out && vc; vc = vc->next)
        if (live(vc) && vc->real)
            out[(*n)++] = vc->real;
    return out;
}

static void cmd_nccl_teardown(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line;
    char why[256];
    typedef ncclResult_t (*err_fn)(ncclComm_t, ncclResult_t *);
    struct gpucr_nccl_finalize_fns fns = {REAL(pncclCommFinalize, comm_fn), REAL(pncclCommAbort, comm_fn),
                                          REAL(pncclCommGetAsyncError, err_fn)};
    comm_fn destroy = REAL(pncclCommDestroy, comm_fn);
    if (timeout_ms < 0)
        timeout_ms = 10000;
    pthread_mutex_lock(&gpucr_nccl_mu);
    const char *bad = unrestorable(why, sizeof why);
    if (!bad && gpucr_cut != CUT_PARKED && live_count())
        bad = "nccl_teardown: the process is not parked at a consistent cut";
    if (!bad && (!fns.finalize || !fns.abort || !destroy))
        bad = "nccl_teardown: this libnccl has no ncclCommFinalize (NCCL 2.14 or later is needed)";
    if (!bad && wait_idle(timeout_ms) != 0)
        bad = "nccl_teardown: an NCCL call of the application did not return in time";
    size_t n = 0;
    ncclComm_t *reals = bad ? NULL : live_reals(&n);
    if (!bad && !reals)
        bad = "nccl_teardown: out of memory";
    if (bad) {
        pthread_mutex_unlock(&gpucr_nccl_mu);
        return reply_error(out, "refused", bad);
    }
    /* parked: no hook touches a real communicator until the rebuild */
    pthread_mutex_unlock(&gpucr_nccl_mu);
    double t0 = gpucr_now();
    ncclResult_t worst = GPUCR_NCCL_SUCCESS;
    int finalized = gpucr_nccl_finalize_all(&fns, reals, n, timeout_ms, &worst) == 0;
    if (finalized)
        for (size_t i = 0; i < n; i++)
            destroy(reals[i]);
    free(reals);
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next)
        if (live(vc))
            vc->real = NULL; /* destroyed, or aborted */
    for (struct gpucr_vreg *reg = gpucr_vreg_first(); reg; reg = reg->next)
        reg->real = NULL; /* went with their communicators */
    pthread_mutex_lock(&gpucr_nccl_mu);
    gpucr_cut = CUT_TORN_DOWN; /* either way none is left: a rebuild makes them anew */
    pthread_mutex_unlock(&gpucr_nccl_mu);
    if (!finalized) {
        snprintf(why, sizeof why,
                 "nccl_teardown: NCCL's finalize did not end in %ld ms (a peer that does not finalize?): "
                 "the communicators were aborted", timeout_ms);
        gpucr_log("nccl: %s", why);
        return reply_error(out, "aborted", why);
    }
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_u64(out, KEY_torn_down, n);
    jb_f64(out, KEY_teardown_s, gpucr_now() - t0);
    if (worst != GPUCR_NCCL_SUCCESS)
        jb_i64(out, KEY_finalize_error, worst);
    jb_end(out);
}

/* After a restore on another node: NCCL's host state made anew (nccl_lib.c). */
static void cmd_nccl_reload(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line, (void)timeout_ms;
    char why[512];
    if (!gpucr_nccl_torn_down())
        return reply_error(out, "not_torn_down", "nccl_reload: the communicators are not torn down");
    double t0 = gpucr_now();
    if (gpucr_nccl_reload(why, sizeof why) != 0)
        return reply_error(out, "failed", why);
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_f64(out, KEY_reload_s, gpucr_now() - t0);
    jb_end(out);
}

static void hex(const unsigned char *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static int unhex(const char *s, unsigned char *p, size_t n)
{
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        p[i] = (unsigned char)v;
    }
    return 0;
}

static void cmd_nccl_ids(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line, (void)timeout_ms;
    typedef ncclResult_t (*fn)(ncclUniqueId *);
    fn get = REAL(pncclGetUniqueId, fn);
    if (!get)
        return reply_error(out, "failed", "nccl_ids: this process has no ncclGetUniqueId");
    if (!gpucr_nccl_torn_down())
        return reply_error(out, "not_torn_down", "nccl_ids: the communicators are not torn down");
    size_t cap = live_count() * (20 + 2 * sizeof(ncclUniqueId)) + 1, len = 0;
    char *list = calloc(1, cap);
    if (!list)
        return reply_error(out, "failed", "nccl_ids: out of memory");
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next) {
        if (!live(vc) || vc->rank != 0)
            continue;
        ncclUniqueId id;
        ncclResult_t r = get(&id);
        if (r != GPUCR_NCCL_SUCCESS) {
            free(list);
            char why[128];
            snprintf(why, sizeof why, "nccl_ids: ncclGetUniqueId failed (NCCL error %d)", r);
            return reply_error(out, "failed", why);
        }
        len += (size_t)snprintf(list + len, cap - len, "%s%016llx=", len ? "," : "", (unsigned long long)vc->key);
        hex((const unsigned char *)&id, sizeof id, list + len);
        len += 2 * sizeof id;
    }
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_str(out, KEY_ids, list);
    jb_end(out);
    free(list);
}

static void cmd_nccl_rebuild(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)timeout_ms;
    typedef ncclResult_t (*init_fn)(ncclComm_t *, int, ncclUniqueId, int);
    typedef ncclResult_t (*config_fn)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    typedef ncclResult_t (*reg_fn)(ncclComm_t, void *, size_t, void **);
    init_fn init = REAL(pncclCommInitRank, init_fn);
    config_fn init_config = REAL(pncclCommInitRankConfig, config_fn);
    reg_fn reg = REAL(pncclCommRegister, reg_fn);
    char *list = string_member(line, KEY_ids);
    char why[256];
    if (!list)
        return reply_error(out, "bad_request", "nccl_rebuild needs \"ids\": \"key=hex,...\"");
    if (!gpucr_nccl_torn_down()) {
        free(list);
        return reply_error(out, "not_torn_down", "nccl_rebuild: the communicators are not torn down");
    }
    double t0 = gpucr_now();
    CUcontext old = NULL;
    int drv = gpucr_driver_loaded();
    if (drv)
        gpucr_drv.cuCtxGetCurrent(&old);
    size_t n = 0;
    for (struct gpucr_vcomm *vc = gpucr_vcomm_first(); vc; vc = vc->next) {
        if (!live(vc) || vc->real)
            continue;
        char val[2 * GPUCR_NCCL_ID_BYTES + 1];
        ncclUniqueId id;
        if (!field_for(list, vc->key, val, sizeof val) || unhex(val, (unsigned char *)&id, sizeof id) != 0) {
            snprintf(why, sizeof why, "nccl_rebuild: no unique id for communicator %016llx", (unsigned long long)vc->key);
            free(list);
            return reply_error(out, "failed", why);
        }
        if (drv && vc->ctx)
            gpucr_drv.cuCtxSetCurrent(vc->ctx); /* NCCL builds on the current device */
        ncclComm_t real = NULL;
        ncclResult_t r;
        if (vc->config_size && init_config) {
            unsigned char cfg[GPUCR_NCCL_CONFIG_MAX];
            memcpy(cfg, vc->config, vc->config_size);
            ((ncclConfig_t *)cfg)->blocking = 1; /* the agents wait for it */
            r = init_config(&real, vc->nranks, id, vc->rank, (ncclConfig_t *)cfg);
        } else {
            r = init ? init(&real, vc->nranks, id, vc->rank) : 3;
        }
        if (r != GPUCR_NCCL_SUCCESS || !real) {
            if (drv)
                gpucr_drv.cuCtxSetCurrent(old);
            snprintf(why, sizeof why, "nccl_rebuild: ncclCommInitRank of communicator %016llx (rank %d of %d) failed "
                     "(NCCL error %d)", (unsigned long long)vc->key, vc->rank, vc->nranks, r);
            free(list);
            return reply_error(out, "failed", why);
        }
        for (struct gpucr_vreg *g = gpucr_vreg_first(); g; g = g->next)
            if (g->vc == vc && !g->gone && reg)
                reg(real, g->buff, g->size, &g->real);
        vc->real = real;
        n++;
    }
    if (drv)
        gpucr_drv.cuCtxSetCurrent(old);
    free(list);
    pthread_mutex_lock(&gpucr_nccl_mu);
    gpucr_cut = CUT_NONE;
    pthread_cond_broadcast(&gpucr_nccl_cv);
    pthread_mutex_unlock(&gpucr_nccl_mu);
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_u64(out, KEY_rebuilt, n);
    jb_f64(out, KEY_rebuild_s, gpucr_now() - t0);
    jb_end(out);
}

static int cmd_nccl(const char *cmd, const char *line, long timeout_ms, struct jbuf *out);

/* control.c: an nccl_* request; 0 when cmd is not one. */
int gpucr_cmd_nccl(const char *cmd, const char *line, long timeout_ms, struct jbuf *out)
{
    gpucr_nccl_inner++; /* the shim's own NCCL calls never park */
    int r = cmd_nccl(cmd, line, timeout_ms, out);
    gpucr_nccl_inner--;
    return r;
}

/* one handler per request of GPUCR_NCCL_COMMANDS (protocol.h), cmd_<name>: a name without one does not build */
static void cmd_nccl_counts(const char *line, long timeout_ms, struct jbuf *out)
{
    (void)line, (void)timeout_ms;
    reply_state(out);
}

static const struct {
    const char *name;
    void (*run)(const char *line, long timeout_ms, struct jbuf *out);
} nccl_commands[] = {
#define GPUCR_NCCL_ENTRY(name) {#name, cmd_##name},
    GPUCR_NCCL_COMMANDS(GPUCR_NCCL_ENTRY)
#undef GPUCR_NCCL_ENTRY
};

static int cmd_nccl(const char *cmd, const char *line, long timeout_ms, struct jbuf *out)
{
    for (size_t i = 0; i < sizeof nccl_commands / sizeof nccl_commands[0]; i++)
        if (!strcmp(cmd, nccl_commands[i].name)) {
            nccl_commands[i].run(line, timeout_ms, out);
            return 1;
        }
    return 0;
}

void gpucr_nccl_cut_after_fork_child(void) { gpucr_cut = CUT_NONE; }
