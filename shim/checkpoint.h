/* checkpoint.c: the shim's half of a checkpoint and of a restore, the commands
 * of a migration, and their state. No CUDA type here: the unit tests answer
 * these commands with stubs (tests/stub_commands.c). */
#ifndef GPUCR_CHECKPOINT_H
#define GPUCR_CHECKPOINT_H

#include <stddef.h>

struct jbuf;

/* What checkpoint and restore did, besides their reply: callers decide by this,
 * never by the reply's text. The reply's "reason" names the same for clients. */
enum gpucr_outcome {
    GPUCR_DONE = 0,
    GPUCR_FAILED,               /* refused or failed; the reply says why */
    GPUCR_ALREADY_CHECKPOINTED, /* someone else's checkpoint holds it (the agent's) */
    GPUCR_NOT_CHECKPOINTED,     /* nothing to restore (restored through the socket) */
};
int gpucr_cmd_checkpoint(long timeout_ms, struct jbuf *out); /* enum gpucr_outcome */
int gpucr_cmd_restore(struct jbuf *out);                    /* enum gpucr_outcome */
/* Ahead of the driver restore: the copy helper starts re-making and filling the
 * GPU memory meanwhile (helper.c). No CUDA call: the driver holds the process. */
void gpucr_cmd_prefill(struct jbuf *out);
void gpucr_cmd_staging_drop(struct jbuf *out);              /* migration */
void gpucr_cmd_arena_detach(struct jbuf *out);              /* migration */
/* migration: linkable, see gpucr_arena_attach_files; the arena's files filled
 * ahead come with the request (gpucr_control_take_fds) */
void gpucr_cmd_arena_attach(int linkable, struct jbuf *out);
void gpucr_cmd_arena_files(const char *line, struct jbuf *out); /* preemption */

int gpucr_checkpoint_running(void); /* not checkpointed now */
int gpucr_host_register(void *base, size_t size); /* pins for the arena */
void gpucr_checkpoint_after_fork_child(void);
void gpucr_checkpoint_at_exit(void);

#endif
