/* A stand-in for libnccl.so.2 in CPU tests of the shim's NCCL hooks: the same
 * exported names (pnccl* and ncclX as weak aliases, as NCCL has), no GPU work.
 * Each communicator counts its operations and dies loudly when it is used
 * after it was destroyed; every make and destroy is logged (FAKE_NCCL_LOG).
 * Like NCCL, it keeps the host it first ran on (NCCL: its bootstrap interface
 * and address) and fails to make a communicator on any other. While the file
 * FAKE_NCCL_BROKEN names exists, it makes none at all (a node whose network
 * NCCL cannot use). As NCCL's bootstrap does, a communicator made by
 * ncclCommInitRank connects its ranks over TCP (rank 0 listens at the address
 * in the unique id), and its finalize is a barrier over those connections:
 * a finalize whose peers cannot be reached waits, as NCCL's does. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct {
    char internal[128];
} ncclUniqueId;

#define MAX_PEERS 8
struct fake_comm {
    unsigned magic;
    int serial, nranks, rank, destroyed;
    long ops;
    int peers[MAX_PEERS]; /* rank 0: one connection per other rank; else [0]: to rank 0; -1: none */
};
#define MAGIC 0xfa4ecc1u

/* The listening sockets of the unique ids this process made (rank 0's). */
static struct {
    char id[128];
    int fd;
} roots[64];

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

/* This host's address as its name resolves (a test-cluster node's own), else loopback. */
static struct in_addr host_addr(void)
{
    char name[256] = "";
    struct addrinfo hints = {.ai_family = AF_INET}, *res = NULL;
    struct in_addr a = {htonl(INADDR_LOOPBACK)};
    gethostname(name, sizeof name);
    if (getaddrinfo(name, NULL, &hints, &res) == 0 && res) {
        a = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
        freeaddrinfo(res);
    }
    return a;
}

EXPORT(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *id))
{
    if (same_host())
        return 2; /* ncclSystemError */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = host_addr()};
    socklen_t len = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, MAX_PEERS) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        return 2;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "fake-%d-%d-%ld@%s:%d", (int)getpid(), serials++, random(),
             inet_ntoa(sa.sin_addr), ntohs(sa.sin_port));
    for (int i = 0; i < 64; i++)
        if (!roots[i].id[0]) {
            snprintf(roots[i].id, sizeof roots[i].id, "%s", id->internal);
            roots[i].fd = fd;
            break;
        }
    return 0;
}

/* Rank 0 takes a connection from every other rank at its id's listening socket;
 * the others connect to the address in the id. */
static int connect_ranks(struct fake_comm *c, const char *id)
{
    for (int i = 0; i < MAX_PEERS; i++)
        c->peers[i] = -1;
    if (c->nranks > MAX_PEERS)
        return -1;
    if (c->rank == 0) {
        int listen_fd = -1;
        for (int i = 0; i < 64; i++)
            if (roots[i].id[0] && !strcmp(roots[i].id, id)) {
                listen_fd = roots[i].fd;
                roots[i].id[0] = 0;
            }
        if (listen_fd < 0)
            return -1;
        for (int r = 1; r < c->nranks; r++)
            if ((c->peers[r] = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC)) < 0)
                return -1;
        close(listen_fd);
        return 0;
    }
    const char *at = strchr(id, '@');
    char host[64];
    int port;
    if (!at || sscanf(at + 1, "%63[^:]:%d", host, &port) != 2)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    inet_aton(host, &sa.sin_addr);
    for (int tries = 0; tries < 2000; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
            c->peers[0] = fd;
            return 0;
        }
        close(fd);
        usleep(10000);
    }
    return -1;
}

/* Every rank's byte to rank 0, then rank 0's to every rank: a finalize waits for its peers. */
static void barrier(struct fake_comm *c)
{
    char b = 1;
    if (c->rank == 0) {
        for (int r = 1; r < c->nranks; r++)
            if (c->peers[r] >= 0 && read(c->peers[r], &b, 1) != 1)
                return;
        for (int r = 1; r < c->nranks; r++)
            if (c->peers[r] >= 0 && write(c->peers[r], &b, 1) != 1)
                return;
    } else if (c->peers[0] >= 0 && write(c->peers[0], &b, 1) == 1) {
        (void)!read(c->peers[0], &b, 1);
    }
}

static void disconnect(struct fake_comm *c)
{
    for (int i = 0; i < MAX_PEERS; i++)
        if (c->peers[i] >= 0) {
            close(c->peers[i]);
            c->peers[i] = -1;
        }
}

EXPORT(ncclResult_t, ncclCommInitRank, (void **comm, int nranks, ncclUniqueId id, int rank))
{
    if (same_host())
        return 2;
    struct fake_comm *c = calloc(1, sizeof *c);
    *c = (struct fake_comm){MAGIC, serials++, nranks, rank, 0, 0, {0}};
    if (connect_ranks(c, id.internal) != 0) {
        fprintf(stderr, "fake nccl: rank %d could not reach its peers (%s)\n", rank, id.internal);
        disconnect(c);
        free(c);
        return 2;
    }
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
    *c = (struct fake_comm){MAGIC, serials++, p->nranks, p->rank, 0, 0, {0}};
    for (int i = 0; i < MAX_PEERS; i++)
        c->peers[i] = -1; /* a split talks through its parent's connections here */
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
    struct fake_comm *c = use(comm);
    barrier(c);
    if (c->destroyed) { /* aborted meanwhile: its connections are ours to close */
        disconnect(c);
        return 5; /* ncclInternalError */
    }
    note("finalize", c);
    return 0;
}

EXPORT(ncclResult_t, ncclCommDestroy, (void *comm))
{
    struct fake_comm *c = use(comm);
    note("destroy", c);
    disconnect(c);
    c->destroyed = 1; /* kept, so that a later use is caught */
    return 0;
}

/* As NCCL's: callable while another thread is blocked in the communicator (its
 * finalize's barrier), which it lets go. */
EXPORT(ncclResult_t, ncclCommAbort, (void *comm))
{
    struct fake_comm *c = use(comm);
    for (int i = 0; i < MAX_PEERS; i++)
        if (c->peers[i] >= 0)
            shutdown(c->peers[i], SHUT_RDWR);
    note("abort", c);
    c->destroyed = 1;
    return 0;
}

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
