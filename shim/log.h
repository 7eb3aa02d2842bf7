/* log.c: diagnostics on stderr (GPUCR_DEBUG), and the clocks. */
#ifndef GPUCR_LOG_H
#define GPUCR_LOG_H

#include <time.h>

void gpucr_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double gpucr_now(void); /* monotonic seconds */
/* The CLOCK_REALTIME time ms from now, for pthread_cond_timedwait. */
struct timespec gpucr_deadline_in(long ms);

#endif
