/* Every key of the JSON messages the shim reads and writes, spelled once: the
 * control socket's requests and answers (gpucr_hpc/shim/protocol.py parses
 * them; tests/test_shim_protocol.py checks that both name the same), another
 * shim's ipc_fd, and the copy helper's requests. The shim names a key as
 * KEY_<key> (protocol_keys.c), never as a string; a key one message shares with
 * another is listed where it first comes. */
#ifndef GPUCR_PROTOCOL_KEYS_H
#define GPUCR_PROTOCOL_KEYS_H

#define GPUCR_KEYS(X)                                                                                      \
    /* every answer */                                                                                     \
    X(ok) X(error) X(reason)                                                                               \
    /* requests: every one, checkpoint and nccl_teardown, ipc_fd, arena_attach, arena_files,              \
     * nccl_targets, nccl_rebuild (and nccl_ids' answer) */                                                \
    X(cmd) X(timeout_ms) X(id) X(linkable) X(into) X(targets) X(ids)                                       \
    /* ping, status */                                                                                     \
    X(pid) X(ppid) X(uid) X(state) X(cuda) X(gpu_bytes) X(checkpointed_bytes) X(allocations) X(mappings)  \
    X(async_allocations) X(async_bytes) X(managed_allocations) X(ipc_in_use) X(multicast_objects)         \
    X(arena_bytes) X(arena_used) X(arena_segments) X(arena_dir) X(arena_hugetlb) X(numa_node)             \
    X(numa_error) X(arena_setup_s) X(helper_setup_s) X(arena_ready) X(arena_prealloc) X(arena_pinned)     \
    X(staging_bytes) X(arena_detached) X(copy_helper) X(helper_segments) X(gate_closed) X(gate_waits)     \
    X(vmm_backing) X(getproc_hooked) X(dlsym_hooked) X(socket) X(nccl_comms) X(nccl_cut)                 \
    /* checkpoint, restore: timings, the data path, the GPUs, the arena placements ("blobs") */           \
    X(quiesce_s) X(data_s) X(prepare_s) X(copy_s) X(release_s) X(create_s) X(data_path)                   \
    X(helper_fallback) X(copy_threads) X(helper_steps) X(copy_stores) X(copy_wait) X(bytes)               \
    X(driver_path_bytes) X(warning) X(device_uuids) X(blobs) X(handle) X(va) X(size) X(device) X(host)    \
    /* prefill, staging_drop, arena_files, arena_detach, arena_attach */                                  \
    X(prefill) X(staging_bytes_dropped) X(linked) X(segment_fds) X(segment_linkable) X(segment_ranges)    \
    X(segments) X(detach_s) X(filled) X(attach_s)                                                          \
    /* NCCL's cut */                                                                                       \
    X(cut) X(quiet) X(settled) X(unrestorable) X(comms) X(torn_down) X(teardown_s) X(finalize_error)      \
    X(reload_s) X(rebuilt) X(rebuild_s)                                                                    \
    /* the copy helper's requests: segment, in_done */                                                     \
    X(seg) X(gen) X(keep)

#define GPUCR_KEY_DECLARE(name) extern const char KEY_##name[];
GPUCR_KEYS(GPUCR_KEY_DECLARE)
#undef GPUCR_KEY_DECLARE

#endif
