/* Which libnccl the hooks call: the one the process loaded, found once; and, after
 * a restore on another node, a fresh copy of it.
 *
 * NCCL keeps per-process host state from its first use (the bootstrap network
 * interface and its address, the host's hash) and never looks again: restored
 * on another node, it would bind its bootstrap to the old node's address. Once
 * every communicator is torn down nothing of the loaded copy is needed any more,
 * so `gpucr_nccl_reload` loads the same file again as a new, private copy
 * (through a memfd: another inode, so the loader makes a new one) and every
 * hook's cached entry point is forgotten, to be looked up there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include "driver.h"
#include "log.h"
#include "nccl_lib.h"

#define MAX_CACHES 256

static void *libnccl;  /* the copy looked in: the loaded one, or a fresh one */
static int reloaded;   /* libnccl is ours: never look in the global scope again */
static void **caches[MAX_CACHES];
static int ncaches;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int find_libnccl(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "libnccl.so")) {
        *(const char **)arg = info->dlpi_name;
        return 1;
    }
    return 0;
}

/* pnccl* are NCCL's own names for its entry points: never one of our hooks.
 * The library may be in the global scope or only in a dlopen'ed group. */
void *gpucr_nccl_real(void **cache, const char *pname)
{
    void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (p)
        return p;
    pthread_mutex_lock(&mu);
    if (!reloaded)
        p = gpucr_real_dlsym(RTLD_DEFAULT, pname);
    if (!p) {
        if (!libnccl) {
            const char *name = NULL;
            dl_iterate_phdr(find_libnccl, &name);
            libnccl = name ? dlopen(name, RTLD_LAZY | RTLD_NOLOAD) : NULL;
        }
        if (libnccl)
            p = gpucr_real_dlsym(libnccl, pname);
    }
    if (!p)
        gpucr_log("nccl: %s not found in this process", pname);
    else if (ncaches < MAX_CACHES)
        caches[ncaches++] = cache;
    __atomic_store_n(cache, p, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&mu);
    return p;
}

struct name_query {
    const char *name;
    int found;
};

static int has_name(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct name_query *q = arg;
    if (info->dlpi_name && !strcmp(info->dlpi_name, q->name))
        q->found = 1;
    return q->found;
}

/* The loader takes a name it has loaded before for the same object, and an
 * earlier copy (restored by CRIU, its descriptor long closed) may carry the name
 * "/proc/self/fd/N": the copy gets a descriptor number no loaded object names. */
static int fresh_name(int fd, char *self, size_t len)
{
    for (int tries = 0; tries < 64; tries++) {
        snprintf(self, len, "/proc/self/fd/%d", fd);
        struct name_query q = {self, 0};
        dl_iterate_phdr(has_name, &q);
        if (!q.found)
            return fd;
        int next = fcntl(fd, F_DUPFD_CLOEXEC, fd + 1);
        close(fd);
        if (next < 0)
            return -1;
        fd = next;
    }
    close(fd);
    return -1;
}

/* The loaded libnccl's file, as the loader found it. */
static int loaded_path(char *out, size_t len)
{
    const char *name = NULL;
    dl_iterate_phdr(find_libnccl, &name);
    if (!name || !*name)
        return -1;
    return snprintf(out, len, "%s", name) < (int)len ? 0 : -1;
}

/* A fresh copy of libnccl for the hooks: 0, or -1 with why. Only while every
 * communicator is torn down (nccl_cut.c checks). */
int gpucr_nccl_reload(char *why, size_t len)
{
    char path[4096], self[64];
    if (loaded_path(path, sizeof path) != 0) {
        snprintf(why, len, "no libnccl is loaded in this process");
        return -1;
    }
    int src = open(path, O_RDONLY | O_CLOEXEC);
    int fd = memfd_create("libnccl.so.2", MFD_CLOEXEC);
    struct stat st;
    int ok = src >= 0 && fd >= 0 && fstat(src, &st) == 0;
    for (off_t off = 0; ok && off < st.st_size;) {
        ssize_t n = sendfile(fd, src, &off, (size_t)(st.st_size - off));
        ok = n > 0;
    }
    void *h = NULL;
    if (ok) {
        fd = fresh_name(fd, self, sizeof self);
        ok = fd >= 0;
    }
    if (ok)
        h = dlopen(self, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        snprintf(why, len, "loading a fresh copy of %s failed: %s", path, ok ? dlerror() : strerror(errno));
    if (src >= 0)
        close(src);
    if (fd >= 0)
        close(fd); /* the mapping keeps the copy */
    if (!h)
        return -1;
    pthread_mutex_lock(&mu);
    libnccl = h;
    reloaded = 1;
    for (int i = 0; i < ncaches; i++)
        __atomic_store_n(caches[i], NULL, __ATOMIC_RELEASE);
    ncaches = 0;
    pthread_mutex_unlock(&mu);
    gpucr_log("nccl: a fresh copy of %s", path);
    return 0;
}
