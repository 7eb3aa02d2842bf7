/*
 * Parsing of the plugstack.conf arguments, for example
 *
 *   optional /usr/local/lib/gpucr/spank_gpucr.so shim=/usr/local/lib/gpucr/libgpucr-cuda.so \
 *            rundir=/run/gpucr imageroot=/scratch/gpucr arena=/dev/hugepages/gpucr
 */
#include "site_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_SHIM      "/usr/local/lib/gpucr/libgpucr-cuda.so"
#define DEFAULT_RUNDIR    "/run/gpucr"
#define DEFAULT_IMAGEROOT "/var/lib/gpucr/images"
#define DEFAULT_ARENA     "/dev/shm"
#define DEFAULT_CLI       "/usr/local/bin/gpucr-hpc"
#define DEFAULT_BINDIR    "/usr/local/lib/gpucr/bin"
#define DEFAULT_SIGNAL    "USR2@120"
#define DEFAULT_OFF       "off"

struct key {
	const char *name;
	size_t offset;
	size_t size;
	int is_path;    /* must be absolute */
};

#define FIELD(f) offsetof(struct gpucr_site, f), sizeof(((struct gpucr_site *)0)->f)

static const struct key keys[] = {
	{ "shim",        FIELD(shim),        1 },
	{ "rundir",      FIELD(rundir),      1 },
	{ "imageroot",   FIELD(imageroot),   1 },
	{ "arena",       FIELD(arena),       1 },
	{ "gpu_feature", FIELD(gpu_feature), 0 },
	{ "vendor",      FIELD(vendor),      0 },
	{ "cli",         FIELD(cli),         1 },
	{ "bindir",      FIELD(bindir),      1 },
	{ "signal",      FIELD(signal),      0 },
	{ "copy_helper", FIELD(copy_helper), 0 },
	{ "arena_prealloc", FIELD(arena_prealloc), 0 },
	{ "interval",    FIELD(interval),    0 },
	{ "stage",       FIELD(stage),       1 },
	{ "stage_cap",   FIELD(stage_cap),   0 },
	{ "outside",     FIELD(outside),     0 },
};

long gpucr_parse_interval(const char *v)
{
	char *end;
	long n;

	if (!strcmp(v, "off"))
		return 0;
	if (*v < '0' || *v > '9')
		return -1;
	n = strtol(v, &end, 10);
	if (n < 0 || n > 100000000 || (*end && end[1]))
		return -1;
	switch (*end) {
	case '\0': case 's': return n;
	case 'm': return n * 60;
	case 'h': return n * 3600;
	default: return -1;
	}
}

int gpucr_outside_valid(const char *v)
{
	return !strcmp(v, "refuse") || !strcmp(v, "close");
}

/* arena_prealloc=auto, off, or a size: digits with an optional . part and
 * one of K M G (as the shim's GPUCR_ARENA_PREALLOC reads it). */
static int prealloc_valid(const char *v)
{
	char *end;

	if (!strcmp(v, "auto") || !strcmp(v, "off"))
		return 1;
	if (*v < '0' || *v > '9' || strtod(v, &end) <= 0)
		return 0;
	return !*end || (strchr("KMGkmg", *end) && !end[1]);
}

/* stage_cap=N% (of the staging file system) or a size: digits with an optional
 * . part and one of K M G T, or bytes (as gpucr_hpc/job/storage/staging.py reads it). */
static int stage_cap_valid(const char *v)
{
	char *end;

	if (*v < '0' || *v > '9' || strtod(v, &end) < 0)
		return 0;
	return !*end || (strchr("%KMGTkmgt", *end) && !end[1]);
}

/* signal=SIG@SECS: a signal name Slurm's --signal accepts, and the seconds
 * before the time limit; or "off". */
static int signal_valid(const char *v)
{
	static const char *names[] = { "USR1", "USR2", "URG", "XCPU", "PWR", "WINCH" };
	const char *at = strchr(v, '@');
	char *end;

	if (!strcmp(v, "off"))
		return 1;
	if (!at || at == v || !at[1])
		return 0;
	strtoul(at + 1, &end, 10);
	if (*end)
		return 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i]) == (size_t)(at - v) && !strncmp(names[i], v, at - v))
			return 1;
	return 0;
}

static int set_error(struct gpucr_site *site, const char *fmt, const char *arg)
{
	if (site->error[0] == '\0')
		snprintf(site->error, sizeof(site->error), fmt, arg);
	return -1;
}

int gpucr_site_parse(struct gpucr_site *site, int ac, char **av)
{
	int rc = 0;

	memset(site, 0, sizeof(*site));
	snprintf(site->shim, sizeof(site->shim), "%s", DEFAULT_SHIM);
	snprintf(site->rundir, sizeof(site->rundir), "%s", DEFAULT_RUNDIR);
	snprintf(site->imageroot, sizeof(site->imageroot), "%s", DEFAULT_IMAGEROOT);
	snprintf(site->arena, sizeof(site->arena), "%s", DEFAULT_ARENA);
	snprintf(site->cli, sizeof(site->cli), "%s", DEFAULT_CLI);
	snprintf(site->bindir, sizeof(site->bindir), "%s", DEFAULT_BINDIR);
	snprintf(site->signal, sizeof(site->signal), "%s", DEFAULT_SIGNAL);
	snprintf(site->copy_helper, sizeof(site->copy_helper), "%s", DEFAULT_OFF);
	/* made ahead by default: the first checkpoint then costs what a later one does */
	snprintf(site->arena_prealloc, sizeof(site->arena_prealloc), "%s", "auto");
	snprintf(site->interval, sizeof(site->interval), "%s", DEFAULT_OFF);
	snprintf(site->stage_cap, sizeof(site->stage_cap), "%s", "50%");
	/* a checkpoint never silently breaks a connection the program did not expect to lose */
	snprintf(site->outside, sizeof(site->outside), "%s", "refuse");

	for (int i = 0; i < ac; i++) {
		const char *eq = strchr(av[i], '=');
		const struct key *k = NULL;

		if (eq) {
			for (size_t j = 0; j < sizeof(keys) / sizeof(keys[0]); j++) {
				if (strlen(keys[j].name) == (size_t)(eq - av[i]) &&
				    !strncmp(keys[j].name, av[i], eq - av[i]))
					k = &keys[j];
			}
		}
		if (!k) {
			rc = set_error(site, "unknown plugstack.conf argument '%s' (known: shim= rundir= imageroot= arena= gpu_feature= vendor= cli= bindir= signal= copy_helper= arena_prealloc= interval= stage= stage_cap= outside=)", av[i]);
			continue;
		}
		const char *val = eq + 1;
		if (k->is_path && val[0] != '/') {
			rc = set_error(site, "plugstack.conf argument '%s' must be an absolute path", av[i]);
			continue;
		}
		if (!strcmp(k->name, "signal") && !signal_valid(val)) {
			rc = set_error(site, "plugstack.conf argument '%s' must be SIG@SECONDS (SIG one of USR1 USR2 URG XCPU PWR WINCH) or off", av[i]);
			continue;
		}
		if (!strcmp(k->name, "copy_helper") && strcmp(val, "on") && strcmp(val, "off")) {
			rc = set_error(site, "plugstack.conf argument '%s' must be on or off", av[i]);
			continue;
		}
		if (!strcmp(k->name, "interval") && gpucr_parse_interval(val) < 0) {
			rc = set_error(site, "plugstack.conf argument '%s' must be a checkpoint interval such as 3600, 90m or 2h, or off", av[i]);
			continue;
		}
		if (!strcmp(k->name, "outside") && !gpucr_outside_valid(val)) {
			rc = set_error(site, "plugstack.conf argument '%s' must be refuse or close", av[i]);
			continue;
		}
		if (!strcmp(k->name, "stage_cap") && !stage_cap_valid(val)) {
			rc = set_error(site, "plugstack.conf argument '%s' must be a share such as 50%% or a size such as 64G", av[i]);
			continue;
		}
		if (!strcmp(k->name, "arena_prealloc") && !prealloc_valid(val)) {
			rc = set_error(site, "plugstack.conf argument '%s' must be auto, off or a size such as 80G", av[i]);
			continue;
		}
		/* after the checks of the value: a long bad one is told what it may be */
		if (strlen(val) >= k->size) {
			rc = set_error(site, "plugstack.conf argument '%s' is too long", av[i]);
			continue;
		}
		memcpy((char *)site + k->offset, val, strlen(val) + 1);
	}
	return rc;
}

int gpucr_expand_path(const char *pattern, const char *nodename,
		      char *out, size_t outlen)
{
	char host[256] = "";
	size_t n = 0;

	for (const char *p = pattern; *p; p++) {
		const char *ins = NULL;
		char one[2] = { *p, '\0' };

		if (*p == '%' && p[1] == 'n') {
			ins = nodename;
			p++;
		} else if (*p == '%' && p[1] == 'h') {
			if (!host[0] && gethostname(host, sizeof(host) - 1) != 0)
				return -1;
			ins = host;
			p++;
		} else if (*p == '%' && p[1] == '%') {
			ins = "%";
			p++;
		} else {
			ins = one;
		}
		if (!ins || !*ins)
			return -1;
		size_t l = strlen(ins);
		if (n + l >= outlen)
			return -1;
		memcpy(out + n, ins, l);
		n += l;
	}
	out[n] = '\0';
	return 0;
}
