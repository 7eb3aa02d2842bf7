/* nccl_cut.c: NCCL communicators across a checkpoint: the consistent cut, the
 * teardown and the rebuild (a stub in unit tests). */
#ifndef GPUCR_NCCL_CUT_H
#define GPUCR_NCCL_CUT_H

#include <stddef.h>

struct jbuf;

/* A request of GPUCR_NCCL_COMMANDS (protocol.h) answered into out: 1; 0 when
 * cmd is not one. */
int gpucr_cmd_nccl(const char *cmd, const char *line, long timeout_ms, struct jbuf *out);
void gpucr_nccl_status(struct jbuf *out);      /* status: nccl_comms, nccl_cut */
int gpucr_nccl_refusal(char *why, size_t len); /* 1: communicators still up */
void gpucr_nccl_cut_after_fork_child(void);

#endif
