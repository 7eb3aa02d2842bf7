/* gate.c: the API gate.
 * Every work-submitting call runs between gpucr_gate_enter/exit. Closing the
 * gate makes new calls wait and waits (bounded) for in-flight calls to drain.
 * Calls nested on one thread pass straight through. */
#ifndef GPUCR_GATE_H
#define GPUCR_GATE_H

#include <stdint.h>

void gpucr_gate_enter(void);
void gpucr_gate_exit(void);
int gpucr_gate_close(long timeout_ms); /* 0 drained; -1 timed out (gate reopened) */
void gpucr_gate_open(void);
int gpucr_gate_is_closed(void);
long gpucr_gate_inflight(void);
uint64_t gpucr_gate_waits(void); /* calls that had to wait, since start */
void gpucr_gate_after_fork_child(void);

#endif
