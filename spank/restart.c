/*
 * Restart of a checkpointed job, and the srun wrapper that makes it possible.
 *
 * srun: the real srun client holds connections to slurmctld and slurmstepd
 * that cannot be checkpointed, so inside a --gpucr=on batch script `srun` is
 * the wrapper in bindir= (put first in PATH here). It runs the real srun
 * outside the script's process tree and waits for the step's exit status in
 * a file; a restore hands that status over once the restored ranks end.
 *
 * Supervisor: the batch step's task is the gpucr-hpc command (cli=), not
 * the script: it runs the script as its child and checkpoints + requeues
 * the job when the warning signal comes (see warn_signal.c).  When a
 * requeued job has a committed checkpoint (<imageroot>/<jobid>/LATEST), it
 * restores the script's tree instead of starting it again.  The task's argv
 * is changed from Slurm 23.02 through spank_prepend_task_argv; before that
 * (22.05) by replacing argv[0] — slurmstepd execs job->argv after
 * task_init, in this child, so that changes only this task.
 */
#include "restart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "task_env.h"

#define ERR(...) (snprintf(err, errlen, __VA_ARGS__), -1)

static int prepend_bindir(spank_t sp, const char *bindir, char *err, size_t errlen)
{
	char path[16384], merged[sizeof(path) + 4096];

	if (spank_getenv(sp, "PATH", path, sizeof(path)) != ESPANK_SUCCESS)
		snprintf(path, sizeof(path), "/usr/bin:/bin");
	if (snprintf(merged, sizeof(merged), "%s:%s", bindir, path) >= (int)sizeof(merged))
		return ERR("PATH is too long");
	if (gpucr_setenv(sp, "PATH", merged) != 0)
		return ERR("cannot set PATH");
	return 0;
}

/* S_SLURM_RESTART_COUNT reads 0 in the batch step of 22.05; the job's own
 * SLURM_RESTART_COUNT is right by task_init. */
static unsigned long restart_count(spank_t sp, const struct gpucr_step *step)
{
	char buf[32];

	if (step->restart_count)
		return step->restart_count;
	if (spank_getenv(sp, "SLURM_RESTART_COUNT", buf, sizeof(buf)) == ESPANK_SUCCESS)
		return strtoul(buf, NULL, 10);
	return 0;
}

static int has_checkpoint(const struct gpucr_site *site, uint32_t jobid)
{
	char latest[4200];

	snprintf(latest, sizeof(latest), "%s/%u/LATEST", site->imageroot, jobid);
	return access(latest, R_OK) == 0;
}

/* "USR2@120" -> "USR2" and "120"; "off" stays "off", lead "". */
static void signal_parts(const char *setting, char *name, size_t namelen,
			 char *lead, size_t leadlen)
{
	size_t n = strcspn(setting, "@");

	snprintf(name, namelen, "%.*s", (int)n, setting);
	snprintf(lead, leadlen, "%s", setting[n] ? setting + n + 1 : "");
}

int gpucr_batch_task_init(spank_t sp, const struct gpucr_site *site,
			  const struct gpucr_step *step, char *err, size_t errlen)
{
	char **argv = NULL, sig[32], lead[32];
	int argc = 0;
	char *cli;

	if (strcmp(step->name, "batch") != 0)
		return 0;
	if (prepend_bindir(sp, site->bindir, err, errlen) != 0)
		return -1;
	if (access(site->cli, X_OK) != 0)
		return ERR("%s (plugstack.conf cli=) is not executable: install gpucr-hpc on this node", site->cli);
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv)
		return ERR("no batch script argv from Slurm");
	signal_parts(site->signal, sig, sizeof(sig), lead, sizeof(lead));
	if (gpucr_setenv(sp, "GPUCR_BATCH_SCRIPT", argv[0]) != 0 ||
	    gpucr_setenv(sp, "GPUCR_BATCH_SUPERVISE", "1") != 0 ||
	    gpucr_setenv(sp, "GPUCR_CHECKPOINT_SIGNAL", sig) != 0 ||
	    gpucr_setenv(sp, "GPUCR_CHECKPOINT_LEAD", lead) != 0)
		return ERR("cannot set GPUCR_BATCH_*");
	if (restart_count(sp, step) > 0 && has_checkpoint(site, step->jobid) &&
	    gpucr_setenv(sp, "GPUCR_RESTORE_BATCH", "1") != 0)
		return ERR("cannot restore: cannot set GPUCR_RESTORE_BATCH");
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 2, 0)
	/* 23.02+: the documented way; argv becomes cli, script, args. */
	{
		const char *prefix[] = { site->cli };

		(void)cli;
		if (gpucr_setenv(sp, "GPUCR_BATCH_ARGV", "prepended") != 0 ||
		    spank_prepend_task_argv(sp, 1, prefix) != ESPANK_SUCCESS)
			return ERR("spank_prepend_task_argv failed");
		return 0;
	}
#else
	/* argv becomes cli, args: the script's path is in GPUCR_BATCH_SCRIPT. */
	cli = strdup(site->cli);
	if (!cli)
		return ERR("out of memory");
	argv[0] = cli;
	return 0;
#endif
}
