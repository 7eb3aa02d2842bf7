/*
 * Site settings of the gpucr SPANK plugin: the key=value arguments of its
 * plugstack.conf line.
 */
#ifndef GPUCR_SITE_CONFIG_H
#define GPUCR_SITE_CONFIG_H

#include <limits.h>
#include <stddef.h>

struct gpucr_site {
	char shim[PATH_MAX];        /* shim=PATH        LD_PRELOAD library       */
	char rundir[PATH_MAX];      /* rundir=DIR       root of per-job run dirs */
	char imageroot[PATH_MAX];   /* imageroot=DIR    checkpoint image store   */
	char arena[PATH_MAX];       /* arena=DIR        node-local host arena    */
	char gpu_feature[256];      /* gpu_feature=LIST node features of GPUs    */
	char vendor[32];            /* vendor=nvidia|amd                         */
	char cli[PATH_MAX];         /* cli=PATH         the gpucr-hpc command    */
	char bindir[PATH_MAX];      /* bindir=DIR       holds the srun wrapper   */
	char signal[32];            /* signal=SIG@SECS|off  checkpoint warning  */
	char copy_helper[8];        /* copy_helper=on|off   GPU data via a helper */
	char arena_prealloc[32];    /* arena_prealloc=auto|SIZE|off  arena ahead */
	char interval[32];          /* interval=N[smh]|off  periodic checkpoints */
	char stage[PATH_MAX];       /* stage=DIR        node memory a preemption
				     *                  writes to first ("": none) */
	char stage_cap[32];         /* stage_cap=N%|SIZE   what staging may take  */
	char outside[8];            /* outside=refuse|close TCP to outside the job */
	char error[512];            /* first problem found, "" when none         */
};

/* Defaults, then ac/av from plugstack.conf.  Returns 0, or -1 with
 * site->error set (the plugin keeps running; only --gpucr=on jobs fail). */
int gpucr_site_parse(struct gpucr_site *site, int ac, char **av);

/* A checkpoint interval: N, Ns, Nm or Nh; off or 0 for none.  Seconds (0: none),
 * or -1 when it is none of those. */
long gpucr_parse_interval(const char *v);

/* A policy for TCP connections to outside the job: 1 for refuse or close, else 0. */
int gpucr_outside_valid(const char *v);

/* Expand %n (short host name: nodename is passed in), %h (full host
 * name) and %% in pattern. */
int gpucr_expand_path(const char *pattern, const char *nodename,
		      char *out, size_t outlen);

#endif
