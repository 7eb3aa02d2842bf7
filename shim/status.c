/* The status request's answer: what every part of the shim says of the
 * process, for `gpucr-hpc status` (whole with --json) and the agents. */
#include <stdint.h>
#include <unistd.h>

#include "arena.h"
#include "arena_ready.h"
#include "checkpoint.h"
#include "control.h"
#include "datapath.h"
#include "driver.h"
#include "gate.h"
#include "helper.h"
#include "hooks_alloc.h"
#include "hooks_async.h"
#include "hooks_vmm.h"
#include "json.h"
#include "nccl_cut.h"
#include "numa.h"
#include "protocol_keys.h"
#include "status.h"
#include "table.h"

static void status_phys(struct gpucr_phys *p, void *arg)
{
    uint64_t *acc = arg; /* [0] resident bytes, [1] checkpointed bytes */
    if (p->dropped != PHYS_RESIDENT)
        acc[1] += p->size;
    else
        acc[0] += p->size;
}

void gpucr_cmd_status(struct jbuf *out)
{
    uint64_t acc[2] = {0, 0};
    size_t exported, imported;
    gpucr_table_lock();
    gpucr_phys_foreach(status_phys, acc);
    gpucr_phys_count_shared(&exported, &imported);
    size_t nphys = gpucr_phys_count(), nmaps = gpucr_map_count();
    size_t nasync = gpucr_set_count(SET_ASYNC), nmanaged = gpucr_set_count(SET_MANAGED);
    uint64_t async_bytes = gpucr_set_sum(SET_ASYNC);
    size_t ipc = gpucr_set_count(SET_IPC_OPENED) + gpucr_ipc_sticky + imported;
    /* a legacy export of a shim-owned allocation is both in the set and flagged */
    ipc += gpucr_set_count(SET_IPC_LEGACY) > exported ? gpucr_set_count(SET_IPC_LEGACY) : exported;
    gpucr_table_unlock();
    jb_begin(out);
    jb_bool(out, KEY_ok, 1);
    jb_i64(out, KEY_pid, getpid());
    jb_i64(out, KEY_ppid, getppid());
    jb_i64(out, KEY_uid, getuid());
    jb_str(out, KEY_state, gpucr_checkpoint_running() ? "running" : "checkpointed");
    jb_bool(out, KEY_cuda, gpucr_driver_loaded());
    jb_u64(out, KEY_gpu_bytes, acc[0]);
    jb_u64(out, KEY_checkpointed_bytes, acc[1]);
    jb_u64(out, KEY_allocations, nphys);
    jb_u64(out, KEY_mappings, nmaps);
    jb_u64(out, KEY_async_allocations, nasync);
    jb_u64(out, KEY_async_bytes, async_bytes);
    jb_u64(out, KEY_managed_allocations, nmanaged);
    jb_u64(out, KEY_ipc_in_use, ipc);
    jb_u64(out, KEY_multicast_objects, __atomic_load_n(&gpucr_multicast, __ATOMIC_RELAXED));
    jb_u64(out, KEY_arena_bytes, gpucr_arena_capacity());
    jb_u64(out, KEY_arena_used, gpucr_arena_used());
    jb_i64(out, KEY_arena_segments, gpucr_arena_segments());
    jb_str(out, KEY_arena_dir, gpucr_arena_dir());
    jb_bool(out, KEY_arena_hugetlb, gpucr_arena_is_hugetlb());
    jb_i64(out, KEY_numa_node, gpucr_numa_node_known());
    jb_str(out, KEY_numa_error, gpucr_numa_error());
    jb_f64(out, KEY_arena_setup_s, gpucr_arena_setup_seconds() + gpucr_staging_seconds() + gpucr_arena_helper_seconds());
    jb_f64(out, KEY_helper_setup_s, gpucr_arena_helper_seconds());
    jb_bool(out, KEY_arena_ready, gpucr_arena_ready());
    jb_str(out, KEY_arena_prealloc, gpucr_arena_ready_mode());
    jb_bool(out, KEY_arena_pinned, gpucr_pin_arena);
    jb_u64(out, KEY_staging_bytes, gpucr_staging_bytes());
    jb_i64(out, KEY_arena_detached, gpucr_arena_detached());
    jb_str(out, KEY_copy_helper, gpucr_helper_enabled() ? gpucr_helper_path() : "");
    jb_i64(out, KEY_helper_segments, gpucr_helper_enabled() ? gpucr_helper_segments() : 0);
    jb_bool(out, KEY_gate_closed, gpucr_gate_is_closed());
    jb_u64(out, KEY_gate_waits, gpucr_gate_waits());
    jb_bool(out, KEY_vmm_backing, gpucr_vmm_backing);
    jb_u64(out, KEY_getproc_hooked, gpucr_stat_getproc_hooked);
    jb_u64(out, KEY_dlsym_hooked, gpucr_stat_dlsym_hooked);
    jb_str(out, KEY_socket, gpucr_control_path());
    gpucr_nccl_status(out);
    jb_end(out);
}
