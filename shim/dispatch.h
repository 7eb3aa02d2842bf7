/* dispatch.c: every request of the control socket, answered. */
#ifndef GPUCR_DISPATCH_H
#define GPUCR_DISPATCH_H

struct jbuf;

/* Answers one request line into out (one JSON object, no newline); the control
 * socket's answerer (gpucr_control_start). */
void gpucr_dispatch(const char *line, struct jbuf *out);

#endif
