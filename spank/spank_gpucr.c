/*
 * gpucr: the Slurm SPANK plugin of gpucr-hpc.
 *
 * sbatch/salloc/srun --gpucr[=on|off].  For a --gpucr=on job, in every task
 * of every step (the batch step and each srun step):
 *   - LD_PRELOAD starts with the shim, exactly once;
 *   - GPUCR_* tell the shim and the agent the job, step, rank, run dir,
 *     image root and site settings;
 *   - the per-job run dir <rundir>/<jobid> on the node exists (job user,
 *     0700) and tasks/<step>.<localid> records each task's pid;
 *   - the job's image dir <imageroot>/<jobid> exists, the job user's alone
 *     (0700), or the task fails (imagedir.c);
 *   - with a staging tier (stage=), <stage>/<jobid> in node memory exists,
 *     the job user's alone, or the job does not stage there (one log line).
 * The job epilog removes the run dir unless it holds root's PERSISTING, and
 * starts the drain of <stage>/<jobid> as the job's user (drain_spawn.c).
 *
 * Failure rule: a job that did not ask for --gpucr never sees an error from
 * this plugin; one that did fails with a one-line "gpucr: ..." message in
 * its own output.
 *
 * Callback order in slurmstepd (remote): init, option callback (replayed),
 * init_post_opt (root: run dir), user_init, then per task: task_init (child,
 * as the user, just before exec: env + task registry), task_exit (parent:
 * registry entry removed); exit.  The job epilog runs in its own process
 * (job_script context) where only job_epilog is called.
 */
#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "drain_spawn.h"
#include "imagedir.h"
#include "option.h"
#include "restart.h"
#include "rundir.h"
#include "site_config.h"
#include "step_info.h"
#include "submission.h"
#include "task_env.h"
#include "warn_signal.h"

SPANK_PLUGIN(gpucr, 1);

static struct gpucr_site site;
static int site_rc;
static enum gpucr_mode step_mode = GPUCR_UNSET;
static struct gpucr_step step;
/* A --gpucr=on step that cannot be set up: reported by every task. */
static char failure[1024];

__attribute__((format(printf, 1, 2)))
static void fail(const char *fmt, ...)
{
	va_list ap;

	if (failure[0])
		return;
	va_start(ap, fmt);
	vsnprintf(failure, sizeof(failure), fmt, ap);
	va_end(ap);
	slurm_error("gpucr: %s", failure);
}

/* A plugin is ABI-tied to the Slurm major.minor it was built for. */
static void check_slurm_version(spank_t sp)
{
	char *major = NULL, *minor = NULL;

	if (spank_get_item(sp, S_SLURM_VERSION_MAJOR, &major) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_SLURM_VERSION_MINOR, &minor) != ESPANK_SUCCESS ||
	    !major || !minor)
		return;
	if (atoi(major) != SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER) ||
	    atoi(minor) != SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER)) {
		snprintf(site.error, sizeof(site.error),
			 "spank_gpucr.so was built for Slurm %d.%02d but runs in Slurm %s.%s: rebuild it (make -C spank)",
			 (int)SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER),
			 (int)SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER), major, minor);
		site_rc = -1;
	}
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	site_rc = gpucr_site_parse(&site, ac, av);
	check_slurm_version(sp);
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE)
		gpucr_option_register(sp, &site);
	if (ctx == S_CTX_ALLOCATOR && site_rc == 0)
		gpucr_warn_signal_from_cmdline(&site);
	if (site_rc != 0 && ctx == S_CTX_SLURMD)
		slurm_error("gpucr: %s; --gpucr=on jobs will fail", site.error);
	return 0;
}

/* <stage>/<jobid>, as root, for the job's user; a failure only means the job
 * does not stage on this node (its preemptions write to the image root). */
static void setup_stage(void)
{
	char stage[PATH_MAX], err[1024];

	if (!site.stage[0])
		return;
	if (gpucr_expand_path(site.stage, step.nodename, stage, sizeof(stage)) != 0) {
		slurm_error("gpucr: job %u: cannot name the staging dir (stage=%s): the job does not stage on %s",
			    step.jobid, site.stage, step.nodename);
		return;
	}
	if (gpucr_stagedir_create(stage, step.jobid, step.uid, step.gid, err, sizeof(err)) != 0)
		slurm_error("gpucr: job %u: staging dir: %s; the job does not stage on %s",
			    step.jobid, err, step.nodename);
}

static void setup_step(spank_t sp)
{
	char err[1024];
	struct stat st;

	if (site_rc != 0) {
		fail("%s (plugstack.conf of this node)", site.error);
		return;
	}
	if (gpucr_step_read(sp, &site, &step, err, sizeof(err)) != 0) {
		fail("%s", err);
		return;
	}
	if (stat(site.shim, &st) != 0 || !S_ISREG(st.st_mode)) {
		fail("shim %s not found on node %s (plugstack.conf shim=)",
		     site.shim, step.nodename);
		return;
	}
	if (gpucr_rundir_create(step.rundir, step.uid, step.gid, err, sizeof(err)) != 0) {
		fail("run dir: %s", err);
		return;
	}
	/* As root, before any task of the job runs: the job's image dir is its user's alone. */
	if (gpucr_imagedir_create(site.imageroot, step.jobid, step.uid, step.gid,
				  err, sizeof(err)) != 0) {
		fail("image dir: %s", err);
		return;
	}
	setup_stage();
}

/* A --gpucr=off step of a --gpucr=on job (the restore of the job's ranks is
 * one, the node agents another): its tasks restore or checkpoint processes of
 * the job, which need this node's run dir (and staging dir), and an ordinary
 * user cannot make them under the root-owned roots. */
static void setup_plain_step(spank_t sp)
{
	char err[1024], id[512];

	if (site_rc != 0 || gpucr_step_is_extern(sp))
		return;
	if (gpucr_step_read(sp, &site, &step, err, sizeof(err)) != 0)
		return;
	if (gpucr_submission_id(sp, step.uid, id, sizeof(id)) != 0)
		return;   /* not a --gpucr=on job */
	if (gpucr_rundir_create(step.rundir, step.uid, step.gid, err, sizeof(err)) != 0) {
		slurm_error("gpucr: run dir: %s", err);
		return;
	}
	setup_stage();  /* the node agents stage there, a rank restore reads it */
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	(void)ac;
	(void)av;
	if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR) {
		char err[1024];

		if (gpucr_option_mode() != GPUCR_ON)
			return 0;
		if (site_rc != 0) {
			slurm_error("gpucr: %s", site.error);
			return -1;
		}
		if (gpucr_submission_mark(sp, err, sizeof(err)) != 0) {
			slurm_error("gpucr: %s", err);
			return -1;
		}
		return 0;
	}
	if (ctx != S_CTX_REMOTE)
		return 0;

	step_mode = gpucr_option_step_mode(sp);
	if (step_mode == GPUCR_OFF)
		setup_plain_step(sp);
	if (step_mode != GPUCR_ON)
		return 0;
	if (gpucr_step_is_extern(sp)) {
		step_mode = GPUCR_UNSET;   /* no user tasks there */
		return 0;
	}
	setup_step(sp);
	return 0;
}

/*
 * A --gpucr=on task that cannot be set up must not run without
 * checkpointing: say why in its own output and end it here, before exec.
 * (A -1 return would be ignored for an `optional` plugin.)
 */
__attribute__((format(printf, 1, 2), noreturn))
static void task_fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "gpucr: error: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	fflush(stderr);
	_exit(1);
}

/* Child of slurmstepd, as the job user, just before exec: set the task's
 * environment and record its pid (exec keeps it) in the task registry. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	uint32_t rank = 0;
	int localid = 0;
	char buf[32], nodename[256], err[1024] = "";

	(void)ac;
	(void)av;
	if (step_mode == GPUCR_OFF) {
		if (site_rc == 0)
			gpucr_env_remove_shim(sp, site.shim);
		return 0;
	}
	if (step_mode != GPUCR_ON)
		return 0;
	if (failure[0])
		task_fail("%s", failure);
	if (spank_get_item(sp, S_TASK_GLOBAL_ID, &rank) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_TASK_ID, &localid) != ESPANK_SUCCESS)
		task_fail("cannot get the task ids from Slurm");
	if (gpucr_env_add_shim(sp, site.shim) != 0 ||
	    gpucr_step_setenv(sp, &site, &step) != 0)
		task_fail("cannot set the task environment (LD_PRELOAD, GPUCR_*)");
	snprintf(buf, sizeof(buf), "%u", rank);
	if (gpucr_setenv(sp, "GPUCR_RANK", buf) != 0)
		task_fail("cannot set GPUCR_RANK");
	snprintf(buf, sizeof(buf), "%d", localid);
	if (gpucr_setenv(sp, "GPUCR_LOCAL_RANK", buf) != 0)
		task_fail("cannot set GPUCR_LOCAL_RANK");
	/* Slurm's name of the node: correct in the task's env by now. */
	if (spank_getenv(sp, "SLURMD_NODENAME", nodename, sizeof(nodename)) == ESPANK_SUCCESS &&
	    nodename[0] && gpucr_setenv(sp, "GPUCR_NODENAME", nodename) != 0)
		task_fail("cannot set GPUCR_NODENAME");
	if (gpucr_task_record(step.rundir, step.name, (uint32_t)localid, getpid(),
			      rank, step.uid, step.gid, err, sizeof(err)) != 0)
		task_fail("task registry: %s", err);
	if (gpucr_submission_id(sp, step.uid, step.submission, sizeof(step.submission)) == 0 &&
	    (gpucr_setenv(sp, "GPUCR_SUBMISSION", step.submission) != 0 ||
	     gpucr_submission_record(step.rundir, step.submission, !strcmp(step.name, "batch"),
				     step.uid, step.gid, err, sizeof(err)) != 0))
		task_fail("submission: %s", err[0] ? err : "cannot set GPUCR_SUBMISSION");
	gpucr_warn_signal_forget(sp);
	if (gpucr_batch_task_init(sp, &site, &step, err, sizeof(err)) != 0)
		task_fail("%s", err);
	return 0;
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av)
{
	int localid = 0;

	(void)ac;
	(void)av;
	if (step_mode != GPUCR_ON || failure[0])
		return 0;
	if (spank_get_item(sp, S_TASK_ID, &localid) == ESPANK_SUCCESS)
		gpucr_task_forget(step.rundir, step.name, (uint32_t)localid);
	return 0;
}

/*
 * Job end, on every node of the job, as root.  Never fails: an epilog
 * error would drain the node.
 */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	struct gpucr_site s;
	char path[4096], err[1024];
	uint32_t jobid;
	uid_t uid;
	gid_t gid;
	int rc;

	if (gpucr_site_parse(&s, ac, av) != 0) {
		slurm_error("gpucr: %s", s.error);
		return 0;
	}
	if (gpucr_epilog_job(sp, &s, &jobid, &uid, &gid, path, sizeof(path)) != 0)
		return 0;
	if (gid == (gid_t)-1) {  /* not told: the user's own primary group */
		struct passwd *pw = getpwuid(uid);

		if (!pw) {
			slurm_error("gpucr: job %u: epilog: no group of uid %u known", jobid, (unsigned)uid);
			return 0;
		}
		gid = pw->pw_gid;
	}
	rc = gpucr_rundir_remove(path, uid, gid, err, sizeof(err));
	if (rc < 0)
		slurm_error("gpucr: job %u: %s", jobid, err);
	else if (rc > 0)
		slurm_info("gpucr: job %u: keeping %s (%s present)", jobid, path,
			   GPUCR_PERSISTING);
	gpucr_spawn_drain(&s, jobid, uid, gid, path);
	return 0;
}
