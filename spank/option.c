/*
 * --gpucr[=on|off]: registered with spank_option_register() because sbatch
 * and salloc of Slurm 22.05 ignore a static spank_options[] table.
 */
#include "option.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "warn_signal.h"

static enum gpucr_mode mode = GPUCR_UNSET;
static const struct gpucr_site *site_cfg;

int gpucr_parse_mode(const char *arg)
{
	static const char *on[] = { "on", "yes", "true", "1" };
	static const char *off[] = { "off", "no", "false", "0" };

	if (arg == NULL)
		return GPUCR_ON;
	for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
		if (!strcasecmp(arg, on[i]))
			return GPUCR_ON;
		if (!strcasecmp(arg, off[i]))
			return GPUCR_OFF;
	}
	return -1;
}

static int option_cb(int val, const char *optarg, int remote)
{
	int m = gpucr_parse_mode(optarg);

	(void)val;
	if (m < 0)
		return -1;   /* Slurm says "Invalid --gpucr argument: VALUE" */
	if (!remote && m == GPUCR_ON && site_cfg)
		gpucr_warn_signal_request(site_cfg);   /* an #SBATCH line */
	mode = m;
	return 0;
}

static char interval[32];   /* --gpucr-interval, "" when not given */

static int interval_cb(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	if (!optarg || gpucr_parse_interval(optarg) < 0 || strlen(optarg) >= sizeof(interval))
		return -1;   /* Slurm says "Invalid --gpucr-interval argument: VALUE" */
	snprintf(interval, sizeof(interval), "%s", optarg);
	return 0;
}

const char *gpucr_option_interval(void)
{
	return interval[0] ? interval : NULL;
}

static struct spank_option interval_option = {
	"gpucr-interval",
	"N[smh]|off",
	"Checkpoint this --gpucr=on job in place every N seconds (or minutes, "
	"hours), against node failures; off: never (the site's default).",
	1,      /* argument required */
	0,
	interval_cb,
};

static struct spank_option gpucr_option = {
	"gpucr",
	"[on|off]",
	"Checkpoint/restore the GPU processes of this job transparently "
	"(gpucr-hpc). --gpucr alone means on.",
	2,      /* optional argument */
	0,
	option_cb,
};

int gpucr_option_register(spank_t sp, const struct gpucr_site *site)
{
	site_cfg = site;
	spank_err_t rc = spank_option_register(sp, &gpucr_option);

	if (rc == ESPANK_SUCCESS)
		rc = spank_option_register(sp, &interval_option);

	if (rc != ESPANK_SUCCESS) {
		slurm_error("gpucr: cannot register --gpucr: %s", spank_strerror(rc));
		return -1;
	}
	return 0;
}

enum gpucr_mode gpucr_option_mode(void)
{
	return mode;
}

enum gpucr_mode gpucr_option_step_mode(spank_t sp)
{
	char buf[64];
	int m;

	if (mode != GPUCR_UNSET)
		return mode;
	if (spank_getenv(sp, GPUCR_OPTION_ENV, buf, sizeof(buf)) != ESPANK_SUCCESS)
		return GPUCR_UNSET;
	/* Slurm stores a bare option (no argument) as an empty value. */
	m = gpucr_parse_mode(buf[0] ? buf : NULL);
	return m < 0 ? GPUCR_UNSET : (enum gpucr_mode)m;
}
