/*
 * The drain of a job's staged checkpoints (plugstack.conf stage=), started by
 * the job epilog: once the job has ended on the node, its units in node
 * memory go to the image root in the background (gpucr-hpc drain JOBID, as
 * root, outside the job), and the node is free meanwhile.
 */
#ifndef GPUCR_DRAIN_SPAWN_H
#define GPUCR_DRAIN_SPAWN_H

#include <stdint.h>

#include "site_config.h"

/* Starts `cli drain JOBID`, detached, when <stage>/<jobid> exists on this node.
 * Returns 1 when started, 0 when there is nothing to drain, -1 on an error
 * (said through slurm_error; never fatal to the epilog). */
int gpucr_spawn_drain(const struct gpucr_site *site, uint32_t jobid);

#endif
