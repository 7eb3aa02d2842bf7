/* The control protocol (protocol.c): one small JSON object per line each way.
 * Requests are flat objects, e.g. {"cmd": "checkpoint", "timeout_ms": 5000}; the
 * keys of every message are in protocol_keys.h. */
#ifndef GPUCR_PROTOCOL_H
#define GPUCR_PROTOCOL_H

#include <stdint.h>

/* Every request the control socket takes, each answered by do_<name> in
 * dispatch.c; serialized (1): run under gpucr_cmd_mu, against a yield on SIGTSTP
 * (suspend.c). gpucr_hpc/shim/protocol.py names the same requests
 * (tests/test_shim_protocol.py checks it). */
#define GPUCR_COMMANDS(X)                                                                                  \
    X(ping, 0) X(status, 0) X(checkpoint, 1) X(restore, 1) X(arena_detach, 1) X(arena_files, 1)             \
    X(staging_drop, 1) X(prefill, 1) X(arena_attach, 1) X(ipc_fd, 0)
/* The requests of NCCL's cut, each answered by cmd_<name> in nccl_cut.c. */
#define GPUCR_NCCL_COMMANDS(X)                                                                              \
    X(nccl_counts) X(nccl_freeze) X(nccl_targets) X(nccl_park) X(nccl_thaw) X(nccl_teardown) X(nccl_reload) \
    X(nccl_ids) X(nccl_rebuild)

struct gpucr_req {
    char cmd[32];
    long timeout_ms; /* -1 when absent */
    uint64_t id;     /* "id" of ipc_fd requests; 0 when absent */
    int linkable;    /* "linkable": true of arena_attach: its files may be linked */
};
int gpucr_req_parse(const char *line, struct gpucr_req *req); /* 0 ok, -1 bad */

#endif
