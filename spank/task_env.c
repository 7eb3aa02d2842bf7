/*
 * LD_PRELOAD editing.  ld.so accepts ':' and blanks as separators; the
 * result is always ':'-separated, with the shim first and the user's own
 * libraries after it in their order.
 */
#include "task_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEPARATORS ": \t"
#define ENV_MAX 65536

static int append(char *out, size_t outlen, size_t *n, const char *s, size_t l)
{
	if (*n + l + 2 > outlen)
		return -1;
	if (*n)
		out[(*n)++] = ':';
	memcpy(out + *n, s, l);
	*n += l;
	out[*n] = '\0';
	return 0;
}

static int filter(const char *shim, const char *old, char *out, size_t outlen,
		  size_t n)
{
	size_t shimlen = strlen(shim);
	const char *p = old ? old : "";

	while (*p) {
		size_t l;

		p += strspn(p, SEPARATORS);
		l = strcspn(p, SEPARATORS);
		if (l && !(l == shimlen && !strncmp(p, shim, l))) {
			if (append(out, outlen, &n, p, l) != 0)
				return -1;
		}
		p += l;
	}
	return 0;
}

int gpucr_preload_prepend(const char *shim, const char *old,
			  char *out, size_t outlen)
{
	size_t n = 0;

	if (outlen == 0)
		return -1;
	out[0] = '\0';
	if (append(out, outlen, &n, shim, strlen(shim)) != 0)
		return -1;
	return filter(shim, old, out, outlen, n);
}

int gpucr_preload_remove(const char *shim, const char *old,
			 char *out, size_t outlen)
{
	if (outlen == 0)
		return -1;
	out[0] = '\0';
	return filter(shim, old, out, outlen, 0);
}

int gpucr_setenv(spank_t sp, const char *name, const char *value)
{
	spank_err_t rc = spank_setenv(sp, name, value, 1);

	if (rc != ESPANK_SUCCESS) {
		slurm_error("gpucr: cannot set %s in the task environment: %s",
			    name, spank_strerror(rc));
		return -1;
	}
	return 0;
}

static int get_preload(spank_t sp, char *buf, size_t len)
{
	spank_err_t rc = spank_getenv(sp, "LD_PRELOAD", buf, (int)len);

	if (rc == ESPANK_ENV_NOEXIST) {
		buf[0] = '\0';
		return 0;
	}
	if (rc != ESPANK_SUCCESS) {
		slurm_error("gpucr: cannot read LD_PRELOAD of the task: %s",
			    spank_strerror(rc));
		return -1;
	}
	return 0;
}

int gpucr_env_add_shim(spank_t sp, const char *shim)
{
	char *old = malloc(ENV_MAX), *new = malloc(ENV_MAX);
	int rc = -1;

	if (!old || !new) {
		slurm_error("gpucr: out of memory");
		goto out;
	}
	if (get_preload(sp, old, ENV_MAX) != 0)
		goto out;
	if (gpucr_preload_prepend(shim, old, new, ENV_MAX) != 0) {
		slurm_error("gpucr: LD_PRELOAD too long");
		goto out;
	}
	rc = gpucr_setenv(sp, "LD_PRELOAD", new);
out:
	free(old);
	free(new);
	return rc;
}

int gpucr_env_remove_shim(spank_t sp, const char *shim)
{
	static const char *vars[] = {
		"GPUCR_JOB_ID", "GPUCR_STEP_ID", "GPUCR_RANK", "GPUCR_LOCAL_RANK",
		"GPUCR_NODE_ID", "GPUCR_NODENAME", "GPUCR_RUN_DIR",
		"GPUCR_IMAGE_ROOT", "GPUCR_ARENA_DIR", "GPUCR_SHIM",
		"GPUCR_GPU_FEATURE", "GPUCR_VENDOR", "GPUCR_RESTART_COUNT",
		"GPUCR_ENABLED", "GPUCR_SUBMISSION", "GPUCR_ARENA_PREALLOC",
		"GPUCR_COPY_HELPER", "GPUCR_COPY_HELPER_START", "GPUCR_CHECKPOINT_INTERVAL",
		"GPUCR_OUTSIDE",
	};
	char *old = malloc(ENV_MAX), *new = malloc(ENV_MAX);
	int rc = -1;

	if (!old || !new)
		goto out;
	if (get_preload(sp, old, ENV_MAX) != 0)
		goto out;
	if (strstr(old, shim)) {
		if (gpucr_preload_remove(shim, old, new, ENV_MAX) != 0)
			goto out;
		if (new[0])
			gpucr_setenv(sp, "LD_PRELOAD", new);
		else
			spank_unsetenv(sp, "LD_PRELOAD");
	}
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		spank_unsetenv(sp, vars[i]);
	rc = 0;
out:
	free(old);
	free(new);
	return rc;
}
