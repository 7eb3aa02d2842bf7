/* status.c: the status request's answer, what every part of the shim says of
 * the process. */
#ifndef GPUCR_STATUS_H
#define GPUCR_STATUS_H

struct jbuf;

void gpucr_cmd_status(struct jbuf *out);

#endif
