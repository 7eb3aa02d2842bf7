/* mem_room.c: host memory this process may still take: its memory cgroups'
 * limits and the node's MemAvailable, the least (SIZE_MAX when none is known);
 * `where` says which. mem_room_for: 0 when `more` fits with a reserve, else -1
 * and why. */
#ifndef GPUCR_MEM_ROOM_H
#define GPUCR_MEM_ROOM_H

#include <stddef.h>

size_t gpucr_mem_room(char *where, size_t wlen);
int gpucr_mem_room_for(size_t more, char *why, size_t len);

#endif
