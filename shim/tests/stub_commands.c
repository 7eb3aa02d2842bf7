/* Command stubs so the GPU-independent core links without CUDA in unit tests. */
#include "gpucr.h"

void gpucr_cmd_status(struct jbuf *out) { jb_begin(out); jb_bool(out, "ok", 1); jb_end(out); }
void gpucr_cmd_checkpoint(long timeout_ms, struct jbuf *out) { (void)timeout_ms; gpucr_cmd_status(out); }
void gpucr_cmd_restore(struct jbuf *out) { gpucr_cmd_status(out); }
void gpucr_cmd_arena_detach(struct jbuf *out) { gpucr_cmd_status(out); }
void gpucr_cmd_arena_attach(struct jbuf *out) { gpucr_cmd_status(out); }
int gpucr_ipc_export_fd(uint64_t id, uint64_t *size) { (void)id; (void)size; return -1; }
