/*
 * The environment of a --gpucr task: the shim in LD_PRELOAD and GPUCR_*.
 */
#ifndef GPUCR_TASK_ENV_H
#define GPUCR_TASK_ENV_H

#include <stddef.h>
#include <slurm/spank.h>

/* out = shim, then every entry of old except the shim itself (LD_PRELOAD
 * entries are separated by ':' or blanks).  Returns -1 when out is too
 * small. */
int gpucr_preload_prepend(const char *shim, const char *old,
			  char *out, size_t outlen);

/* out = old without any entry equal to shim. */
int gpucr_preload_remove(const char *shim, const char *old,
			 char *out, size_t outlen);

/* spank_setenv with a slurm_error naming the variable on failure. */
int gpucr_setenv(spank_t sp, const char *name, const char *value);

/* Put the shim first in the task's LD_PRELOAD (exactly once). */
int gpucr_env_add_shim(spank_t sp, const char *shim);

/* Take the shim out of LD_PRELOAD and drop GPUCR_* (an explicit
 * --gpucr=off step inside a --gpucr=on job). */
int gpucr_env_remove_shim(spank_t sp, const char *shim);

#endif
