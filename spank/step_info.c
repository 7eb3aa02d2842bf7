/*
 * Job/step facts from Slurm (spank_get_item) and the GPUCR_* variables.
 */
#include "step_info.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "option.h"
#include "task_env.h"

#define ERR(...) (snprintf(err, errlen, __VA_ARGS__), -1)

int gpucr_node_name(char *buf, size_t len)
{
	char *dot;

	/* Not SLURMD_NODENAME: slurmstepd has no environment of its own and
	 * the step's inherits the value of the batch script's node.  The host
	 * name is the same in slurmd, slurmstepd and the epilog of a node. */
	if (gethostname(buf, len - 1) != 0)
		return -1;
	buf[len - 1] = '\0';
	dot = strchr(buf, '.');
	if (dot)
		*dot = '\0';
	return 0;
}

static void step_name(uint32_t stepid, char *buf, size_t len)
{
	switch (stepid) {
	case SLURM_BATCH_SCRIPT:
		snprintf(buf, len, "batch");
		break;
	case SLURM_EXTERN_CONT:
		snprintf(buf, len, "extern");
		break;
#ifdef SLURM_INTERACTIVE_STEP
	case SLURM_INTERACTIVE_STEP:
		snprintf(buf, len, "interactive");
		break;
#endif
	default:
		snprintf(buf, len, "%u", stepid);
	}
}

int gpucr_step_is_extern(spank_t sp)
{
	uint32_t stepid = 0;

	return spank_get_item(sp, S_JOB_STEPID, &stepid) == ESPANK_SUCCESS &&
	       stepid == SLURM_EXTERN_CONT;
}

static int job_rundir(const struct gpucr_site *site, const char *nodename,
		      uint32_t jobid, char *out, size_t outlen)
{
	char root[PATH_MAX];

	if (gpucr_expand_path(site->rundir, nodename, root, sizeof(root)) != 0)
		return -1;
	if (snprintf(out, outlen, "%s/%u", root, jobid) >= (int)outlen)
		return -1;
	return 0;
}

int gpucr_step_read(spank_t sp, const struct gpucr_site *site,
		    struct gpucr_step *step, char *err, size_t errlen)
{
	spank_err_t rc;

	memset(step, 0, sizeof(*step));
	if ((rc = spank_get_item(sp, S_JOB_ID, &step->jobid)) != ESPANK_SUCCESS ||
	    (rc = spank_get_item(sp, S_JOB_STEPID, &step->stepid)) != ESPANK_SUCCESS ||
	    (rc = spank_get_item(sp, S_JOB_UID, &step->uid)) != ESPANK_SUCCESS ||
	    (rc = spank_get_item(sp, S_JOB_GID, &step->gid)) != ESPANK_SUCCESS ||
	    (rc = spank_get_item(sp, S_JOB_NODEID, &step->nodeid)) != ESPANK_SUCCESS)
		return ERR("cannot get job/step ids from Slurm: %s", spank_strerror(rc));
	if (spank_get_item(sp, S_SLURM_RESTART_COUNT, &step->restart_count) != ESPANK_SUCCESS)
		step->restart_count = 0;
	step_name(step->stepid, step->name, sizeof(step->name));
	if (gpucr_node_name(step->nodename, sizeof(step->nodename)) != 0)
		return ERR("cannot find the node name");
	if (job_rundir(site, step->nodename, step->jobid, step->rundir,
		       sizeof(step->rundir)) != 0)
		return ERR("bad run dir pattern rundir=%s", site->rundir);
	if (gpucr_expand_path(site->arena, step->nodename, step->arena,
			      sizeof(step->arena)) != 0)
		return ERR("bad arena pattern arena=%s", site->arena);
	return 0;
}

/* A variable the job set itself is left as it is: the user's choice wins. */
static int setenv_default(spank_t sp, const char *name, const char *value)
{
	char have[8];
	spank_err_t rc = spank_getenv(sp, name, have, sizeof(have));

	if (rc == ESPANK_SUCCESS || rc == ESPANK_NOSPACE)
		return 0;
	return gpucr_setenv(sp, name, value);
}

/* The site's fast path (plugstack copy_helper=on, arena_prealloc=): the copy
 * helper on the job's run dir socket of this node (set in every step: a step
 * inherits the batch node's path), started by the shim through the CLI when
 * none serves, unless the job says GPUCR_COPY_HELPER=off; the arena made
 * ready ahead of checkpoints. */
static int fast_path_setenv(spank_t sp, const struct gpucr_site *site,
			    const struct gpucr_step *step)
{
	char sock[PATH_MAX + 32], have[8] = "";
	int rc = 0;

	if (spank_getenv(sp, "GPUCR_COPY_HELPER", have, sizeof(have)) != ESPANK_SUCCESS)
		have[0] = '\0';
	if (!strcmp(site->copy_helper, "on") && strcmp(have, "off")) {
		snprintf(sock, sizeof(sock), "%s/copy-helper.sock", step->rundir);
		rc |= gpucr_setenv(sp, "GPUCR_COPY_HELPER", sock);
		rc |= gpucr_setenv(sp, "GPUCR_COPY_HELPER_START", site->cli);
	}
	if (strcmp(site->arena_prealloc, "off"))
		rc |= setenv_default(sp, "GPUCR_ARENA_PREALLOC", site->arena_prealloc);
	return rc;
}

/* GPUCR_CHECKPOINT_INTERVAL (seconds) for the batch supervisor: the job's
 * --gpucr-interval, else the site's interval= unless the job set its own. */
static int interval_setenv(spank_t sp, const struct gpucr_site *site)
{
	const char *given = gpucr_option_interval();
	char buf[32];

	if (given) {
		snprintf(buf, sizeof(buf), "%ld", gpucr_parse_interval(given));
		return gpucr_setenv(sp, "GPUCR_CHECKPOINT_INTERVAL", buf);
	}
	if (gpucr_parse_interval(site->interval) <= 0)
		return 0;
	snprintf(buf, sizeof(buf), "%ld", gpucr_parse_interval(site->interval));
	return setenv_default(sp, "GPUCR_CHECKPOINT_INTERVAL", buf);
}

/* GPUCR_OUTSIDE for the node agent, which reads it from each task's initial
 * environment: the job's --gpucr-outside, else the site's outside= unless the
 * job set its own (an srun step inherits its batch step's). */
static int outside_setenv(spank_t sp, const struct gpucr_site *site)
{
	const char *given = gpucr_option_outside();

	if (given)
		return gpucr_setenv(sp, "GPUCR_OUTSIDE", given);
	return setenv_default(sp, "GPUCR_OUTSIDE", site->outside);
}

int gpucr_step_setenv(spank_t sp, const struct gpucr_site *site,
		      const struct gpucr_step *step)
{
	char buf[32];
	int rc = 0;

	snprintf(buf, sizeof(buf), "%u", step->jobid);
	rc |= gpucr_setenv(sp, "GPUCR_JOB_ID", buf);
	rc |= gpucr_setenv(sp, "GPUCR_STEP_ID", step->name);
	snprintf(buf, sizeof(buf), "%u", step->nodeid);
	rc |= gpucr_setenv(sp, "GPUCR_NODE_ID", buf);
	rc |= gpucr_setenv(sp, "GPUCR_NODENAME", step->nodename);
	snprintf(buf, sizeof(buf), "%u", step->restart_count);
	rc |= gpucr_setenv(sp, "GPUCR_RESTART_COUNT", buf);
	rc |= gpucr_setenv(sp, "GPUCR_RUN_DIR", step->rundir);
	rc |= gpucr_setenv(sp, "GPUCR_IMAGE_ROOT", site->imageroot);
	rc |= gpucr_setenv(sp, "GPUCR_ARENA_DIR", step->arena);
	rc |= gpucr_setenv(sp, "GPUCR_SHIM", site->shim);
	if (site->gpu_feature[0])
		rc |= gpucr_setenv(sp, "GPUCR_GPU_FEATURE", site->gpu_feature);
	if (site->vendor[0])
		rc |= gpucr_setenv(sp, "GPUCR_VENDOR", site->vendor);
	rc |= gpucr_setenv(sp, "GPUCR_ENABLED", "1");
	rc |= fast_path_setenv(sp, site, step);
	rc |= interval_setenv(sp, site);
	rc |= outside_setenv(sp, site);
	return rc ? -1 : 0;
}

static int env_u32(const char *name, uint32_t *out)
{
	const char *v = getenv(name);
	char *end;
	unsigned long n;

	if (!v || !*v)
		return -1;
	n = strtoul(v, &end, 10);
	if (*end)
		return -1;
	*out = (uint32_t)n;
	return 0;
}

int gpucr_epilog_job(spank_t sp, const struct gpucr_site *site,
		     uint32_t *jobid, uid_t *uid, gid_t *gid,
		     char *rundir, size_t rundirlen)
{
	char nodename[256];
	uint32_t u = 0, g = 0;

	if (spank_get_item(sp, S_JOB_ID, jobid) != ESPANK_SUCCESS &&
	    env_u32("SLURM_JOB_ID", jobid) != 0) {
		slurm_error("gpucr: epilog: no job id");
		return -1;
	}
	if (spank_get_item(sp, S_JOB_UID, uid) != ESPANK_SUCCESS) {
		if (env_u32("SLURM_JOB_UID", &u) != 0) {
			slurm_error("gpucr: epilog: no job uid");
			return -1;
		}
		*uid = u;
	}
	if (spank_get_item(sp, S_JOB_GID, gid) != ESPANK_SUCCESS) {
		if (env_u32("SLURM_JOB_GID", &g) != 0)
			g = (uint32_t)-1;  /* unknown: keep the user's own */
		*gid = g;
	}
	if (gpucr_node_name(nodename, sizeof(nodename)) != 0 ||
	    job_rundir(site, nodename, *jobid, rundir, rundirlen) != 0) {
		slurm_error("gpucr: epilog: cannot compute the run dir of job %u", *jobid);
		return -1;
	}
	return 0;
}
