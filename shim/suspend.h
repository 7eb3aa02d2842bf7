/* suspend.c: VRAM yield on SIGTSTP, restore on SIGCONT. */
#ifndef GPUCR_SUSPEND_H
#define GPUCR_SUSPEND_H

#include <pthread.h>

/* Held while a command that moves GPU memory runs: by the control thread
 * (dispatch.c) or by the yield. */
extern pthread_mutex_t gpucr_cmd_mu;
/* Installs the handlers and their thread if enabled and the program left both
 * signals at SIG_DFL: 1 installed, 0 not (disabled or the program's own), -1 error. */
int gpucr_tstp_install(void);
int gpucr_tstp_installed(void); /* our SIGTSTP handler is in place in this process */
void gpucr_tstp_after_fork_child(void);

#endif
