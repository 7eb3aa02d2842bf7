/* Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle).
 *
 * The driver refuses legacy IPC on VMM memory, and the shim backs plain
 * allocations with VMM (hooks_alloc.c). So for such an allocation the shim
 * gives out its own handle: a magic, the exporting PID and an export id. The
 * importing process's shim asks the exporter's control socket for the
 * allocation's shareable file descriptor (SCM_RIGHTS, same user or root only)
 * and maps it with the VMM import calls. Handles of memory the shim does not
 * own go to the driver unchanged. Every export and import is tracked: a
 * process that shares GPU memory is refused at checkpoint (checkpoint.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "control.h"
#include "driver.h"
#include "export.h"
#include "gate.h"
#include "ipc_legacy.h"
#include "json.h"
#include "log.h"
#include "protocol_keys.h"
#include "table.h"

#define MAGIC "GPUCRIP1"

struct shim_handle { /* inside CUipcMemHandle.reserved (64 bytes) */
    char magic[8];
    int32_t pid;
    uint32_t id;
    uint64_t size;
};
_Static_assert(sizeof(struct shim_handle) <= sizeof(((CUipcMemHandle *)0)->reserved), "handle too big");

struct export {
    uint32_t id;
    int fd;
    uint64_t vhandle, size;
};
struct import {
    uint64_t va, size, rhandle;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct export *exports;
static size_t nexports, capexports;
static struct import *imports;
static size_t nimports, capimports;
static uint32_t next_id = 1;

static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, nc * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

/* ---- exporting ------------------------------------------------------------ */

static void find_map(struct gpucr_map *m, void *arg) { *(struct gpucr_map **)arg = m; }

/* The export of a shim-owned allocation (created on first use). Table locked. */
static struct export *export_of(struct gpucr_phys *p, CUresult *rc)
{
    for (size_t i = 0; i < nexports; i++)
        if (exports[i].vhandle == p->vhandle)
            return &exports[i];
    int fd = -1;
    *rc = gpucr_drv.cuMemExportToShareableHandle(&fd, p->rhandle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (*rc != CUDA_SUCCESS)
        return NULL;
    if (grow((void **)&exports, &capexports, nexports, sizeof *exports) < 0) {
        close(fd);
        *rc = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    struct export *e = &exports[nexports++];
    e->id = next_id++;
    e->fd = fd;
    e->vhandle = p->vhandle;
    e->size = p->size;
    return e;
}

GPUCR_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    GPUCR_LOAD_OR_FAIL();
    struct gpucr_map *m = NULL;
    gpucr_table_lock();
    gpucr_map_foreach_in(dptr, 1, find_map, &m);
    struct gpucr_phys *p = m ? gpucr_phys_get(m->vhandle) : NULL;
    if (p && (p->flags & PHYS_SHIM_OWNED)) {
        CUresult r = CUDA_SUCCESS;
        pthread_mutex_lock(&mu);
        struct export *e = export_of(p, &r);
        if (e) {
            struct shim_handle h;
            memset(pHandle, 0, sizeof *pHandle);
            memcpy(h.magic, MAGIC, sizeof h.magic);
            h.pid = (int32_t)getpid();
            h.id = e->id;
            h.size = e->size;
            memcpy(pHandle->reserved, &h, sizeof h);
            p->flags |= PHYS_EXPORTED;
            gpucr_set_put(SET_IPC_LEGACY, m->va, 1);
        }
        pthread_mutex_unlock(&mu);
        gpucr_table_unlock();
        if (r != CUDA_SUCCESS)
            gpucr_log("legacy IPC export of %#llx failed (CUDA error %d)", (unsigned long long)dptr, (int)r);
        return r;
    }
    gpucr_table_unlock();
    CUresult r = gpucr_drv.cuIpcGetMemHandle(pHandle, dptr);
    if (r == CUDA_SUCCESS) {
        gpucr_table_lock();
        gpucr_set_put(SET_IPC_LEGACY, dptr, 1);
        gpucr_table_unlock();
    }
    return r;
}

int gpucr_ipc_export_fd(uint64_t id, uint64_t *size)
{
    int fd = -1;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nexports; i++)
        if (exports[i].id == id) {
            fd = fcntl(exports[i].fd, F_DUPFD_CLOEXEC, 0);
            *size = exports[i].size;
        }
    pthread_mutex_unlock(&mu);
    return fd;
}

void gpucr_ipc_forget(uint64_t vhandle)
{
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nexports; i++)
        if (exports[i].vhandle == vhandle) {
            close(exports[i].fd);
            exports[i] = exports[--nexports];
            break;
        }
    pthread_mutex_unlock(&mu);
}

/* ---- importing ------------------------------------------------------------ */

/* Asks process PID's shim for the descriptor of export ID. */
static int fetch_fd(int32_t pid, uint32_t id)
{
    char dir[100], path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (gpucr_run_dir(dir, sizeof dir) < 0 || snprintf(path, sizeof path, "%s/%d.sock", dir, (int)pid) >= (int)sizeof path)
        return -1;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct timeval tv = {10, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    char req[64];
    struct jbuf j;
    jb_init_fixed(&j, req, sizeof req - 1);
    jb_begin(&j);
    jb_str(&j, KEY_cmd, "ipc_fd");
    jb_u64(&j, KEY_id, id);
    jb_end(&j);
    req[j.len++] = '\n'; /* one request line */
    ssize_t n = (ssize_t)j.len;
    int fd = -1;
    struct json_value ok;
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0 && send(s, req, (size_t)n, MSG_NOSIGNAL) == n) {
        char buf[256];
        size_t have = 0;
        while (have < sizeof buf - 1 && !memchr(buf, '\n', have)) {
            union {
                struct cmsghdr h;
                char b[CMSG_SPACE(sizeof(int))];
            } ctl;
            struct iovec iov = {buf + have, sizeof buf - 1 - have};
            struct msghdr msg;
            gpucr_msghdr(&msg, &iov, ctl.b, sizeof ctl.b);
            ssize_t got = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                break;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd < 0)
                    memcpy(&fd, CMSG_DATA(c), sizeof fd);
            have += (size_t)got;
        }
        buf[have] = 0;
        char *nl = memchr(buf, '\n', have);
        if (nl)
            *nl = 0; /* the answer line */
        if (fd >= 0 && (json_find(buf, KEY_ok, &ok) != 1 || ok.type != JSON_TRUE)) {
            close(fd);
            fd = -1;
        }
    }
    close(s);
    return fd;
}

static CUresult open_shim_handle(CUdeviceptr *pdptr, const struct shim_handle *h)
{
    if (h->pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: not in the exporting process */
    CUdevice dev = 0;
    CUresult r = gpucr_drv.cuCtxGetDevice(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    int fd = fetch_fd(h->pid, h->id);
    if (fd < 0) {
        gpucr_log("legacy IPC handle of process %d: its shim gave no descriptor for export %u", (int)h->pid, h->id);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    CUmemGenericAllocationHandle rh = 0;
    r = gpucr_drv.cuMemImportFromShareableHandle(&rh, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr va = 0;
    if ((r = gpucr_drv.cuMemAddressReserve(&va, h->size, 0, 0, 0)) != CUDA_SUCCESS)
        goto release;
    if ((r = gpucr_drv.cuMemMap(va, h->size, 0, rh, 0)) != CUDA_SUCCESS)
        goto free_va;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = gpucr_drv.cuMemSetAccess(va, h->size, &acc, 1)) != CUDA_SUCCESS)
        goto unmap;
    pthread_mutex_lock(&mu);
    if (grow((void **)&imports, &capimports, nimports, sizeof *imports) < 0) {
        pthread_mutex_unlock(&mu);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto unmap;
    }
    imports[nimports++] = (struct import){va, h->size, rh};
    pthread_mutex_unlock(&mu);
    *pdptr = va;
    return CUDA_SUCCESS;
unmap:
    gpucr_drv.cuMemUnmap(va, h->size);
free_va:
    gpucr_drv.cuMemAddressFree(va, h->size);
release:
    gpucr_drv.cuMemRelease(rh);
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    CUresult r;
    struct shim_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (!memcmp(h.magic, MAGIC, sizeof h.magic))
        r = open_shim_handle(pdptr, &h);
    else
        r = gpucr_drv.cuIpcOpenMemHandle_v2(pdptr, handle, flags);
    if (r == CUDA_SUCCESS) {
        gpucr_table_lock();
        gpucr_set_put(SET_IPC_OPENED, *pdptr, 1);
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}

GPUCR_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    GPUCR_LOAD_OR_FAIL();
    gpucr_gate_enter();
    struct import im = {0, 0, 0};
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nimports; i++)
        if (imports[i].va == dptr) {
            im = imports[i];
            imports[i] = imports[--nimports];
            break;
        }
    pthread_mutex_unlock(&mu);
    CUresult r;
    if (im.va) {
        gpucr_drv.cuCtxSynchronize(); /* as cuIpcCloseMemHandle: work using it is done */
        r = gpucr_drv.cuMemUnmap(im.va, im.size);
        gpucr_drv.cuMemAddressFree(im.va, im.size);
        gpucr_drv.cuMemRelease(im.rhandle);
    } else {
        r = gpucr_drv.cuIpcCloseMemHandle(dptr);
    }
    if (r == CUDA_SUCCESS) {
        gpucr_table_lock();
        gpucr_set_take(SET_IPC_OPENED, dptr, NULL);
        gpucr_table_unlock();
    }
    gpucr_gate_exit();
    return r;
}
