/* Finding the real driver, lazily, and handing out our hooks in its place.
 *
 * The shim never links against libcuda: it is dlopen'ed the first time the
 * process uses the driver through us. Programs reach driver entry points three
 * ways and all three lead to the hooks:
 *   - direct calls to exported symbols (this library is preloaded first);
 *   - dlsym() on libcuda (the runtime looks up cuGetProcAddress this way);
 *   - cuGetProcAddress[_v2]() (how the runtime and frameworks get everything).
 * A pointer obtained from the driver is replaced by our hook when it equals the
 * real function the hook stands for. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "driver.h"
#include "export.h"
#include "hooks.h"
#include "log.h"

struct gpucr_driver gpucr_drv;
unsigned long gpucr_stat_getproc_hooked, gpucr_stat_dlsym_hooked;

static void *(*real_dlsym_fn)(void *, const char *);
static void *libcuda;
static int loaded; /* 1 ok, -1 failed */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int loading;

static void resolve_real_dlsym(void)
{
    if (!real_dlsym_fn)
        real_dlsym_fn = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym_fn)
        real_dlsym_fn = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

void *gpucr_real_dlsym(void *handle, const char *name)
{
    resolve_real_dlsym();
    return real_dlsym_fn ? real_dlsym_fn(handle, name) : NULL;
}

static int load_locked(int only_if_present)
{
    if (loaded)
        return loaded > 0 ? 0 : -1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (!h && only_if_present)
        return -1; /* not loaded yet: nothing of the driver to hook */
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        gpucr_log("libcuda.so.1 not found: %s", dlerror());
        loaded = -1;
        return -1;
    }
    libcuda = h;
#define GPUCR_RESOLVE(fn) gpucr_drv.fn = (__typeof__(gpucr_drv.fn))gpucr_real_dlsym(h, #fn);
    GPUCR_DRIVER_FUNCS(GPUCR_RESOLVE)
#undef GPUCR_RESOLVE
    gpucr_drv.cuMemAllocAsync_ptsz = (__typeof__(gpucr_drv.cuMemAllocAsync_ptsz))gpucr_real_dlsym(h, "cuMemAllocAsync_ptsz");
    gpucr_drv.cuMemAllocFromPoolAsync_ptsz =
        (__typeof__(gpucr_drv.cuMemAllocFromPoolAsync_ptsz))gpucr_real_dlsym(h, "cuMemAllocFromPoolAsync_ptsz");
    gpucr_drv.cuMemFreeAsync_ptsz = (__typeof__(gpucr_drv.cuMemFreeAsync_ptsz))gpucr_real_dlsym(h, "cuMemFreeAsync_ptsz");
    gpucr_drv.cuGetProcAddress_v1 = (gpucr_pfn_getproc_v1)gpucr_real_dlsym(h, "cuGetProcAddress");
    for (const struct gpucr_hook *e = gpucr_hooks; e->name; e++)
        *e->real = gpucr_real_dlsym(h, e->name);
    loaded = 1;
    gpucr_log("driver loaded");
    if (gpucr_on_driver_load)
        gpucr_on_driver_load();
    return 0;
}

static int load(int only_if_present)
{
    if (loaded)
        return loaded > 0 ? 0 : -1;
    if (loading)
        return -1; /* libcuda's own initialisation calling back into us */
    loading = 1;
    pthread_mutex_lock(&load_mu);
    int rc = load_locked(only_if_present);
    pthread_mutex_unlock(&load_mu);
    loading = 0;
    return rc;
}

int gpucr_driver_load(void) { return load(0); }
int gpucr_driver_loaded(void) { return loaded > 0; }

void *gpucr_hook_for_real(void *real)
{
    if (!real || loaded <= 0)
        return NULL;
    for (const struct gpucr_hook *e = gpucr_hooks; e->name; e++)
        if (*e->real == real || e->hook == real)
            return e->hook;
    return NULL;
}

/* Driver entry points are named cu + capital letter (cuMemAlloc_v2); that
 * excludes cudaMalloc, curl_easy_init, ... */
static int driver_name(const char *name)
{
    return name && name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z';
}

GPUCR_EXPORT void *dlsym(void *handle, const char *name)
{
    resolve_real_dlsym();
    if (handle == RTLD_NEXT || loading || !driver_name(name))
        return real_dlsym_fn(handle, name); /* tail call: the caller's RTLD_NEXT stays right */
    void *p = real_dlsym_fn(handle, name);
    if (!p || load(1) != 0)
        return p;
    void *h = gpucr_hook_for_real(p);
    if (h && h != p) {
        __atomic_fetch_add(&gpucr_stat_dlsym_hooked, 1, __ATOMIC_RELAXED);
        return h;
    }
    return p;
}
