/* One rank of a job whose ranks talk through NCCL (the fake one in CPU tests):
 *   ranks RANK NRANKS DIR STEPS DELAY_US [window|multicast]
 * Rank 0 writes the unique id to DIR/id; every rank makes the world
 * communicator, splits a child off it, registers a buffer, and then each step
 * all-reduces on the world (twice in a group every 4th step) and on the child
 * every 3rd, sleeps DELAY_US, and appends the step to DIR/rank-RANK.txt. A
 * watchdog thread asks for asynchronous errors all along, as PyTorch's does.
 * window: a symmetric window, a communicator the shim cannot rebuild;
 * multicast: a call of cuMulticastCreate as NCCL's NVLS makes (to whatever
 * exports it: under the shim, its hook; the call itself fails without a GPU). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config);
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t comm, void *stream);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err);
ncclResult_t ncclCommRegister(ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(ncclComm_t comm, void *handle);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, void **win, int flags);

static ncclComm_t world;
static volatile int done;

static void *watchdog(void *arg)
{
    (void)arg;
    while (!done) {
        ncclResult_t e = 0;
        if (ncclCommGetAsyncError(world, &e) != 0 || e != 0) {
            fprintf(stderr, "watchdog: an error\n");
            exit(3);
        }
        usleep(500);
    }
    return NULL;
}

#define CHECK(x)                                                  \
    do {                                                          \
        if ((x) != 0) {                                           \
            fprintf(stderr, "rank: %s failed\n", #x);             \
            exit(2);                                              \
        }                                                         \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 6 && argc != 7)
        return 2;
    int rank = atoi(argv[1]), nranks = atoi(argv[2]), steps = atoi(argv[4]), delay = atoi(argv[5]);
    char path[4096];
    ncclUniqueId id;
    snprintf(path, sizeof path, "%s/id", argv[3]);
    if (rank == 0) {
        CHECK(ncclGetUniqueId(&id));
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        fwrite(&id, sizeof id, 1, f);
        fclose(f);
        rename(tmp, path);
    } else {
        FILE *f;
        while (!(f = fopen(path, "r")))
            usleep(1000);
        if (fread(&id, sizeof id, 1, f) != 1)
            return 2;
        fclose(f);
    }
    ncclComm_t child;
    void *handle;
    static char buf[4096];
    CHECK(ncclCommInitRank(&world, nranks, id, rank));
    CHECK(ncclCommSplit(world, 0, rank, &child, NULL));
    CHECK(ncclCommRegister(world, buf, sizeof buf, &handle));
    void *win;
    if (argc == 7 && strcmp(argv[6], "window") == 0)
        CHECK(ncclCommWindowRegister(world, buf, sizeof buf, &win, 0));
    if (argc == 7 && strcmp(argv[6], "multicast") == 0) {
        int (*create)(void *, const void *) = (int (*)(void *, const void *))dlsym(RTLD_DEFAULT, "cuMulticastCreate");
        if (create)
            (void)create(NULL, NULL);
    }
    pthread_t t;
    pthread_create(&t, NULL, watchdog, NULL);
    snprintf(path, sizeof path, "%s/rank-%d.txt", argv[3], rank);
    for (int i = 0; i < steps; i++) {
        if (i % 4 == 0) {
            CHECK(ncclGroupStart());
            CHECK(ncclAllReduce(buf, buf, 1, 0, 0, world, NULL));
            CHECK(ncclAllReduce(buf, buf, 1, 0, 0, world, NULL));
            CHECK(ncclGroupEnd());
        } else {
            CHECK(ncclAllReduce(buf, buf, 1, 0, 0, world, NULL));
        }
        if (i % 3 == 0)
            CHECK(ncclAllReduce(buf, buf, 1, 0, 0, child, NULL));
        FILE *f = fopen(path, "a");
        fprintf(f, "%d\n", i);
        fclose(f);
        usleep((useconds_t)delay);
    }
    done = 1;
    pthread_join(t, NULL);
    CHECK(ncclCommDeregister(world, handle));
    CHECK(ncclCommDestroy(child));
    CHECK(ncclCommDestroy(world));
    printf("rank %d done\n", rank);
    return 0;
}
