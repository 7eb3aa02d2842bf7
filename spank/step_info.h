/*
 * What the plugin needs to know about the current job step, and the
 * GPUCR_* variables made from it.
 */
#ifndef GPUCR_STEP_INFO_H
#define GPUCR_STEP_INFO_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>
#include <slurm/spank.h>

#include "site_config.h"

struct gpucr_step {
	uint32_t jobid;
	uint32_t stepid;
	char name[32];           /* "batch", "extern", "interactive" or the number */
	uint32_t nodeid;         /* relative node id within the step */
	uint32_t restart_count;
	uid_t uid;
	gid_t gid;
	char nodename[256];
	char rundir[PATH_MAX];   /* <rundir root>/<jobid> */
	char arena[PATH_MAX];
	char submission[512];    /* GPUCR_SUBMISSION; "" when the job has no token */
};

/* Remote context. Returns -1 with err set on failure. */
int gpucr_step_read(spank_t sp, const struct gpucr_site *site,
		    struct gpucr_step *step, char *err, size_t errlen);

int gpucr_step_is_extern(spank_t sp);

/* GPUCR_JOB_ID, _STEP_ID, _NODE_ID, _NODENAME, _RUN_DIR, _IMAGE_ROOT,
 * _ARENA_DIR, _SHIM, _GPU_FEATURE, _VENDOR, _RESTART_COUNT, _ENABLED, the
 * fast path's, _CHECKPOINT_INTERVAL and _OUTSIDE. */
int gpucr_step_setenv(spank_t sp, const struct gpucr_site *site,
		      const struct gpucr_step *step);

/* Job script (epilog) context: job id, user and run dir path. */
int gpucr_epilog_job(spank_t sp, const struct gpucr_site *site,
		     uint32_t *jobid, uid_t *uid, gid_t *gid,
		     char *rundir, size_t rundirlen);

/* This node's short host name (what %n expands to). */
int gpucr_node_name(char *buf, size_t len);

#endif
