/*
 * The submission token of a --gpucr=on job (see submission.h).
 */
#define _GNU_SOURCE
#include "submission.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define ERR(...) (snprintf(err, errlen, __VA_ARGS__), -1)
#define TOKEN_VAR "GPUCR_SUBMISSION"
#define TOKEN_BYTES 16

int gpucr_submission_mark(spank_t sp, char *err, size_t errlen)
{
	unsigned char raw[TOKEN_BYTES];
	char token[2 * TOKEN_BYTES + 1];
	spank_err_t rc;

	/* srun inside an existing job makes a step, not a submission: the step
	 * inherits the job's token through its environment. */
	if (spank_context() == S_CTX_LOCAL && getenv("SLURM_JOB_ID"))
		return 0;
	if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
		return ERR("cannot make a submission token: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(raw); i++)
		snprintf(token + 2 * i, 3, "%02x", raw[i]);
	rc = spank_job_control_setenv(sp, TOKEN_VAR, token, 1);
	if (rc != ESPANK_SUCCESS)
		return ERR("cannot record the submission token: %s", spank_strerror(rc));
	return 0;
}

int gpucr_submission_id(spank_t sp, uid_t uid, char *out, size_t outlen)
{
	char token[128], cluster[256];

	if (spank_getenv(sp, "SLURM_SPANK_" TOKEN_VAR, token, sizeof(token)) != ESPANK_SUCCESS ||
	    !token[0])
		return -1;
	if (spank_getenv(sp, "SLURM_CLUSTER_NAME", cluster, sizeof(cluster)) != ESPANK_SUCCESS)
		cluster[0] = '\0';
	if (snprintf(out, outlen, "%s:%u:%s", cluster, (unsigned)uid, token) >= (int)outlen)
		return -1;
	return 0;
}

int gpucr_submission_record(const char *rundir, const char *id, int replace,
			    uid_t uid, gid_t gid, char *err, size_t errlen)
{
	char tmp[4200], path[4200], text[512];
	int fd, len;

	snprintf(path, sizeof(path), "%s/%s", rundir, GPUCR_SUBMISSION_FILE);
	if (!replace && access(path, F_OK) == 0)
		return 0;
	snprintf(tmp, sizeof(tmp), "%s/.%s.%ld", rundir, GPUCR_SUBMISSION_FILE, (long)getpid());
	len = snprintf(text, sizeof(text), "%s\n", id);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return ERR("cannot create %s: %s", tmp, strerror(errno));
	if (write(fd, text, len) != len || fchown(fd, uid, gid) != 0) {
		int e = errno;

		close(fd);
		unlink(tmp);
		return ERR("cannot write %s: %s", tmp, strerror(e));
	}
	if (close(fd) != 0) {
		unlink(tmp);
		return ERR("cannot write %s: %s", tmp, strerror(errno));
	}
	if (rename(tmp, path) != 0) {
		unlink(tmp);
		return ERR("cannot rename to %s: %s", path, strerror(errno));
	}
	return 0;
}
