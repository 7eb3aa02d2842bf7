/* helper.c: the copy helper path (GPUCR_COPY_HELPER): another process moves
 * the data between the GPU and the arena. */
#ifndef GPUCR_HELPER_H
#define GPUCR_HELPER_H

#include <cuda.h>
#include <stddef.h>

struct gpucr_copy_stats;
struct gpucr_phys;

int gpucr_helper_enabled(void);
CUresult gpucr_helper_out(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st);
CUresult gpucr_helper_in(struct gpucr_phys *const *p, size_t n, struct gpucr_copy_stats *st);
/* after a successful gpucr_helper_in, always: its copies done (keep: the helper keeps its handles) */
CUresult gpucr_helper_in_wait(struct gpucr_phys *const *p, size_t n, int keep, struct gpucr_copy_stats *st);
int gpucr_helper_prefill(struct gpucr_phys *const *p, size_t n); /* no CUDA call */
int gpucr_helper_share_arena(double *secs); /* no CUDA call */
int gpucr_helper_start(double timeout_s);   /* GPUCR_COPY_HELPER_START; no CUDA call */
void gpucr_helper_after_fork_child(void);
void gpucr_helper_disconnect(void); /* before CRIU dumps the process (arena_detach) */
void gpucr_helper_forget(struct gpucr_phys *p); /* the helper lets go of its handle of p */
const char *gpucr_helper_error(void); /* why its last use failed */
const char *gpucr_helper_path(void);  /* its socket */
int gpucr_helper_segments(void);      /* arena segments it has mapped, as they are */
int gpucr_helper_connected(void);     /* a connection is open (none after a migration) */

#endif
