/* control.c: the per-process control socket, which carries request lines and
 * their answers; what they say is the answerer's (dispatch.c). */
#ifndef GPUCR_CONTROL_H
#define GPUCR_CONTROL_H

#include <stddef.h>

struct jbuf;
struct msghdr;
struct iovec;

/* Answers one request line into out (one JSON object, no newline). */
typedef void (*gpucr_answer_fn)(const char *line, struct jbuf *out);
int gpucr_control_start(gpucr_answer_fn answer); /* a socket and its thread; 0 ok */
void gpucr_control_stop(void);
void gpucr_control_after_fork_child(gpucr_answer_fn answer); /* the child's own socket */
const char *gpucr_control_path(void);
int gpucr_run_dir(char *out, size_t len); /* creates it (0700) if missing; 0 ok */
/* The descriptors that came with the request being answered (SCM_RIGHTS), taken
 * by the caller: their number, or -1 when more came than `max` or than fit. */
int gpucr_control_take_fds(int *out, int max);
/* A descriptor sent with the answer being written, taken: closed once sent. */
void gpucr_control_reply_fd(int fd);
/* m: one buffer (iov) and room for descriptors (ctl), for sendmsg/recvmsg. */
void gpucr_msghdr(struct msghdr *m, struct iovec *iov, void *ctl, size_t ctl_len);

#endif
