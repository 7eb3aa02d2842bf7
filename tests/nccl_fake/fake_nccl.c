/* A stand-in for libnccl.so.2 in CPU tests of the shim's NCCL hooks: the same
 * exported names (pnccl* and ncclX as weak aliases, as NCCL has), no GPU work.
 * Each communicator counts its operations and dies loudly when it is used
 * after it was destroyed; every make and destroy is logged (FAKE_NCCL_LOG).
 * Like NCCL, it keeps the host it first ran on (NCCL: its bootstrap interface
 * and address) and fails to make a communicator on any other. While the file
 * FAKE_NCCL_BROKEN names exists, it makes none at all (a node whose network
 * NCCL cannot use). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct {
    char internal[128];
} ncclUniqueId;

struct fake_comm {
    unsigned magic;
    int serial, nranks, rank, destroyed;
    long ops;
};
#define MAGIC 0xfa4ecc1u

static int serials;
static char first_host[256];

/* 0 on the host this copy first ran on; else NCCL's failure to bind its
 * bootstrap to an address the node does not have. */
static int same_host(void)
{
    const char *broken = getenv("FAKE_NCCL_BROKEN");
    if (broken && access(broken, F_OK) == 0) {
        fprintf(stderr, "fake nccl: broken (%s exists)\n", broken);
        return -1;
    }
    char now[256] = "";
    gethostname(now, sizeof now);
    if (!first_host[0])
        snprintf(first_host, sizeof first_host, "%s", now);
    if (!strcmp(first_host, now))
        return 0;
    fprintf(stderr, "fake nccl: bootstrap on %s's address, but this is %s\n", first_host, now);
    return -1;
}

static void note(const char *what, struct fake_comm *c)
{
    const char *path = getenv("FAKE_NCCL_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (!f)
        return;
    fprintf(f, "%s %d rank=%d ops=%ld\n", what, c->serial, c->rank, c->ops);
    fclose(f);
}

static struct fake_comm *use(void *comm)
{
    struct fake_comm *c = comm;
    if (!c || c->magic != MAGIC || c->destroyed) {
        fprintf(stderr, "fake nccl: a communicator used after its destroy, or not one (%p)\n", comm);
        abort();
    }
    return c;
}

#define EXPORT(ret, name, params)                                                         \
    ret p##name params __attribute__((visibility("default")));                          \
    ret name params __attribute__((weak, alias("p" #name), visibility("default")));     \
    ret p##name params

EXPORT(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *id))
{
    if (same_host())
        return 2; /* ncclSystemError */
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "fake-%d-%d-%ld", (int)getpid(), serials++, random());
    return 0;
}

EXPORT(ncclResult_t, ncclCommInitRank, (void **comm, int nranks, ncclUniqueId id, int rank))
{
    (void)id;
    if (same_host())
        return 2;
    struct fake_comm *c = calloc(1, sizeof *c);
    *c = (struct fake_comm){MAGIC, serials++, nranks, rank, 0, 0};
    *comm = c;
    note("init", c);
    return 0;
}

EXPORT(ncclResult_t, ncclCommInitRankConfig, (void **comm, int nranks, ncclUniqueId id, int rank, void *config))
{
    (void)config;
    return pncclCommInitRank(comm, nranks, id, rank);
}

EXPORT(ncclResult_t, ncclCommSplit, (void *comm, int color, int key, void **newcomm, void *config))
{
    (void)key;
    (void)config;
    struct fake_comm *p = use(comm);
    if (color < 0) {
        *newcomm = NULL;
        return 0;
    }
    struct fake_comm *c = calloc(1, sizeof *c);
    *c = (struct fake_comm){MAGIC, serials++, p->nranks, p->rank, 0, 0};
    *newcomm = c;
    note("split", c);
    return 0;
}

EXPORT(ncclResult_t, ncclAllReduce, (const void *s, void *r, size_t n, int dt, int op, void *comm, void *stream))
{
    (void)s; (void)r; (void)n; (void)dt; (void)op; (void)stream;
    use(comm)->ops++;
    return 0;
}

EXPORT(ncclResult_t, ncclCommFinalize, (void *comm))
{
    note("finalize", use(comm));
    return 0;
}

EXPORT(ncclResult_t, ncclCommDestroy, (void *comm))
{
    struct fake_comm *c = use(comm);
    note("destroy", c);
    c->destroyed = 1; /* kept, so that a later use is caught */
    return 0;
}

EXPORT(ncclResult_t, ncclCommAbort, (void *comm)) { return pncclCommDestroy(comm); }

EXPORT(ncclResult_t, ncclCommGetAsyncError, (void *comm, ncclResult_t *err))
{
    use(comm);
    *err = 0;
    return 0;
}

EXPORT(ncclResult_t, ncclCommCount, (void *comm, int *n)) { *n = use(comm)->nranks; return 0; }
EXPORT(ncclResult_t, ncclCommUserRank, (void *comm, int *r)) { *r = use(comm)->rank; return 0; }
EXPORT(ncclResult_t, ncclGroupStart, (void)) { return 0; }
EXPORT(ncclResult_t, ncclGroupEnd, (void)) { return 0; }

EXPORT(ncclResult_t, ncclCommRegister, (void *comm, void *buff, size_t size, void **handle))
{
    (void)buff; (void)size;
    use(comm);
    *handle = malloc(8);
    note("register", comm);
    return 0;
}

EXPORT(ncclResult_t, ncclCommDeregister, (void *comm, void *handle))
{
    use(comm);
    free(handle);
    return 0;
}

EXPORT(ncclResult_t, ncclCommWindowRegister, (void *comm, void *buff, size_t size, void **win, int flags))
{
    (void)buff; (void)size; (void)flags;
    use(comm);
    *win = malloc(8);
    return 0;
}
