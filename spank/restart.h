/*
 * The batch step of a --gpucr=on job: the srun wrapper first in PATH, and,
 * when a requeued job has a committed checkpoint, the restorer in place of
 * the batch script.
 */
#ifndef GPUCR_RESTART_H
#define GPUCR_RESTART_H

#include <stddef.h>
#include <slurm/spank.h>

#include "site_config.h"
#include "step_info.h"

/* Task context of the batch step (child, as the job user, before exec).
 * Returns -1 with err set on failure. */
int gpucr_batch_task_init(spank_t sp, const struct gpucr_site *site,
			  const struct gpucr_step *step, char *err, size_t errlen);

#endif
