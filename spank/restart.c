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
 * the job when the warning signal comes (see warn_signal.c).  When the
 * job's own submission has a committed checkpoint (see should_restore), it
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

/* Whether the pointer file <imageroot>/<jobid>/<name> ("gen-N" and the
 * generation's submission, one per line) names a committed (or staged)
 * generation of this submission. */
static int points_to_mine(const struct gpucr_site *site, uint32_t jobid,
			  const char *name, const char *submission)
{
	char path[4200], gen[64], owner[512];
	FILE *f;
	int n;

	snprintf(path, sizeof(path), "%s/%u/%s", site->imageroot, jobid, name);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fscanf(f, "%63s %511s", gen, owner);
	fclose(f);
	if (n != 2 || strncmp(gen, "gen-", 4) != 0 || strchr(gen, '/') ||
	    strcmp(owner, submission) != 0)
		return 0;
	snprintf(path, sizeof(path), "%s/%u/%s/COMMITTED", site->imageroot, jobid, gen);
	if (access(path, R_OK) == 0)
		return 1;
	/* staged in node memory: the restorer waits for its drain (generations.py) */
	snprintf(path, sizeof(path), "%s/%u/%s/STAGED", site->imageroot, jobid, gen);
	return access(path, R_OK) == 0;
}

/* A start restores when its own submission has a committed generation,
 * whatever Restarts says (slurmctld may have reset it), and never from
 * another submission's (a job id handed out again).  A resubmitted job
 * (GPUCR_RESTORE_FROM: what `gpucr-hpc restore` of a job Slurm forgot
 * sets) restores that generation until it has one of its own; the
 * restorer checks that it is this user's. */
static int should_restore(spank_t sp, const struct gpucr_site *site,
			  const struct gpucr_step *step)
{
	char from[4096], committed[4200];

	if (!step->submission[0])
		return 0;
	if (points_to_mine(site, step->jobid, "RESTORE", step->submission) ||
	    points_to_mine(site, step->jobid, "LATEST", step->submission))
		return 1;
	if (spank_getenv(sp, "GPUCR_RESTORE_FROM", from, sizeof(from)) != ESPANK_SUCCESS || !from[0])
		return 0;
	snprintf(committed, sizeof(committed), "%s/COMMITTED", from);
	return access(committed, R_OK) == 0;
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
	if (should_restore(sp, site, step) &&
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
