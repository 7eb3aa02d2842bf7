/*
 * The drain of a job's staged checkpoints (plugstack.conf stage=), started by
 * the job epilog: once the job has ended on the node, its units in node
 * memory go to the image root in the background (gpucr-hpc drain JOBID, as
 * the job's user, outside the job), and the node is free meanwhile; then the
 * job's staging dir goes.
 */
#ifndef GPUCR_DRAIN_SPAWN_H
#define GPUCR_DRAIN_SPAWN_H

#include <stdint.h>
#include <sys/types.h>

#include "site_config.h"

/* When <stage>/<jobid> on this node is a directory of the job's user (uid):
 * starts, detached, `cli drain JOBID` as that user (uid, gid and the user's
 * groups; in /, with a clean environment) if a generation is in it, then
 * removes the directory (contents as the user) once the drain has ended,
 * unless the job's run dir `rundir` is there again (the job is back on this
 * node).  Returns 1 when a drain was started, 0 when there is nothing to
 * drain, -1 on an error (said through slurm_error; never fatal to the
 * epilog; a staging dir that is not the job user's is left alone). */
int gpucr_spawn_drain(const struct gpucr_site *site, uint32_t jobid, uid_t uid, gid_t gid,
		      const char *rundir);

#endif
