/*
 * The per-job run dir on each node, <rundir root>/<jobid>, and the task
 * registry in it (tasks/<step>.<local task id>).
 */
#ifndef GPUCR_RUNDIR_H
#define GPUCR_RUNDIR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A file of this name in the run dir keeps it at job end (a checkpoint in
 * it is still being persisted): only a regular file of root's; one the job's
 * user made is ignored. */
#define GPUCR_PERSISTING "PERSISTING"
#define GPUCR_TASKS_DIR  "tasks"

/* Create root (root-owned, 0755) if missing, then root/<jobid> and
 * root/<jobid>/tasks owned by uid:gid with mode 0700.  Idempotent (several
 * steps of a job share it).  On error returns -1 with a message in err. */
int gpucr_rundir_create(const char *path, uid_t uid, gid_t gid,
			char *err, size_t errlen);

/* Remove the run dir unless it holds root's PERSISTING.  The contents are
 * removed with the job user's identity.  Returns 0 (also when already gone),
 * 1 when kept, -1 on error with err set. */
int gpucr_rundir_remove(const char *path, uid_t uid, gid_t gid,
			char *err, size_t errlen);

/* A directory of the job's user in a directory only root writes to (the run
 * dir, the staging dir): emptied as the user (uid:gid, no groups; never
 * following links), then removed as root.  One of another owner, or not a
 * directory, is left alone.  Returns 0 (also when already gone), -1 on
 * error with err set. */
int gpucr_dir_remove_as_user(const char *path, uid_t uid, gid_t gid,
			     char *err, size_t errlen);

/* tasks/<step>.<localid>: "pid=P\nrank=R\nlocal_id=L\nstep=S\n". */
int gpucr_task_record(const char *path, const char *step, uint32_t localid,
		      pid_t pid, uint32_t rank, uid_t uid, gid_t gid,
		      char *err, size_t errlen);
int gpucr_task_forget(const char *path, const char *step, uint32_t localid);

#endif
