/* Start-up and shutdown of the shim in every process it is loaded into, and the
 * calls up the layers, handed down as pointers: the control socket's answerer,
 * the GPU that places memory (numa.c), what a loaded driver starts (driver.c).
 * Loading it must be harmless: nothing here touches the GPU driver. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "arena_ready.h"
#include "checkpoint.h"
#include "control.h"
#include "copy_engine.h"
#include "datapath.h"
#include "dispatch.h"
#include "driver.h"
#include "gate.h"
#include "hooks_alloc.h"
#include "log.h"
#include "nccl_comms.h"
#include "nccl_cut.h"
#include "numa.h"
#include "numa_gpu.h"
#include "suspend.h"
#include "table.h"

/* Set statically: a constructor of another library may load the driver before
 * gpucr_init runs. */
int (*gpucr_on_driver_load)(void) = gpucr_tstp_install;

static int enabled(const char *var, int dflt)
{
    const char *v = getenv(var);
    if (!v || !*v)
        return dflt;
    return !(strcmp(v, "0") == 0 || strcmp(v, "no") == 0 || strcmp(v, "off") == 0);
}

static void after_fork_child(void)
{
    gpucr_gate_after_fork_child();
    gpucr_table_after_fork_child();
    gpucr_arena_after_fork_child();
    gpucr_numa_after_fork_child();
    gpucr_checkpoint_after_fork_child();
    gpucr_arena_ready_after_fork_child();
    gpucr_tstp_after_fork_child();
    gpucr_nccl_comms_after_fork_child();
    gpucr_nccl_cut_after_fork_child();
    if (enabled("GPUCR_CONTROL", 1))
        gpucr_control_after_fork_child(gpucr_dispatch);
}

__attribute__((constructor)) static void gpucr_init(void)
{
    if (enabled("GPUCR_DISABLE", 0))
        return;
    gpucr_vmm_backing = enabled("GPUCR_VMM_BACKING", 1);
    gpucr_numa_gpu_busid = gpucr_gpu_busid; /* asked only once a context is current */
    gpucr_datapath_init();
    const char *arena = getenv("GPUCR_ARENA_DIR");
    if (gpucr_arena_configure(arena) < 0) {
        gpucr_log("arena dir %s unusable, using /dev/shm", arena ? arena : "(none)");
        gpucr_arena_configure(NULL);
    }
    gpucr_engine_choose(); /* after the arena pinning is settled; settles the helper */
    gpucr_arena_ready_init(getenv("GPUCR_ARENA_PREALLOC")); /* a size, or auto */
    pthread_atfork(NULL, NULL, after_fork_child);
    if (enabled("GPUCR_CONTROL", 1))
        gpucr_control_start(gpucr_dispatch);
}

__attribute__((destructor)) static void gpucr_fini(void)
{
    gpucr_control_stop();
    gpucr_checkpoint_at_exit();
}
