/*
 * Which submission a job is.  Once slurmctld has lost its state it hands job
 * ids out again, and a requeue resets SubmitTime, so Slurm itself tells no
 * two submissions of one id apart.  When sbatch, salloc or srun creates a
 * --gpucr=on job, the plugin puts a random token into the job's control
 * environment (spank_job_control_setenv): slurmctld keeps it with the job
 * across requeues and its own restarts, and every step sees it as
 * SLURM_SPANK_GPUCR_SUBMISSION (also with --export=NONE).  Each task then
 * gets GPUCR_SUBMISSION=<cluster>:<uid>:<token>, and the node's run dir the
 * same in the file `submission` (read by the node agents at a checkpoint).
 */
#ifndef GPUCR_SUBMISSION_H
#define GPUCR_SUBMISSION_H

#include <stddef.h>
#include <sys/types.h>
#include <slurm/spank.h>

#define GPUCR_SUBMISSION_FILE "submission"

/* Local/allocator context, for a job being created: a fresh token.
 * Returns -1 with err set on failure. */
int gpucr_submission_mark(spank_t sp, char *err, size_t errlen);

/* Remote context: "<cluster>:<uid>:<token>" of the job, or -1 when the job
 * carries no token (submitted where the plugin did not run). */
int gpucr_submission_id(spank_t sp, uid_t uid, char *out, size_t outlen);

/* <rundir>/submission = id, written atomically by a task of the job: by the
 * batch step's always (it starts every run of the job), by other steps' only
 * where none is there yet (a step attached from outside, srun --jobid, may
 * carry another token). */
int gpucr_submission_record(const char *rundir, const char *id, int replace,
			    uid_t uid, gid_t gid, char *err, size_t errlen);

#endif
