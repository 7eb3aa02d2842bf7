/* arena_ready.c: the arena made ready ahead of checkpoints (GPUCR_ARENA_PREALLOC). */
#ifndef GPUCR_ARENA_READY_H
#define GPUCR_ARENA_READY_H

void gpucr_arena_ready_init(const char *spec); /* a size, or auto */
void gpucr_arena_ready_after_fork_child(void);
int gpucr_arena_ready(void);
const char *gpucr_arena_ready_mode(void); /* "auto", "size" or "off" */
double gpucr_arena_helper_seconds(void); /* the copy helper's mapping and pinning */

#endif
