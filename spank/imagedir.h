#ifndef GPUCR_IMAGEDIR_H
#define GPUCR_IMAGEDIR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* <imageroot>/<jobid>: made (job user, 0700) or checked; -1 and err if it
 * cannot be made or is not the job user's alone (then it is never used). */
int gpucr_imagedir_create(const char *imageroot, uint32_t jobid, uid_t uid,
			  gid_t gid, char *err, size_t errlen);

/* <stage>/<jobid> (stage: this node's, %n expanded) the same way; the stage
 * root itself must be root's and writable by root only.  -1 and err: the job
 * does not stage on this node (its units go to the image root). */
int gpucr_stagedir_create(const char *stage, uint32_t jobid, uid_t uid,
			  gid_t gid, char *err, size_t errlen);

#endif
