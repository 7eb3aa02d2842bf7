/*
 * --gpucr[=on|off], --gpucr-interval and --gpucr-outside: registered with
 * spank_option_register() because sbatch and salloc of Slurm 22.05 ignore a
 * static spank_options[] table.
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

static char outside[8];   /* --gpucr-outside, "" when not given */

static int outside_cb(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	if (!optarg || !gpucr_outside_valid(optarg))
		return -1;   /* Slurm says "Invalid --gpucr-outside argument: VALUE" */
	snprintf(outside, sizeof(outside), "%s", optarg);
	return 0;
}

const char *gpucr_option_outside(void)
{
	return outside[0] ? outside : NULL;
}

static struct spank_option outside_option = {
	"gpucr-outside",
	"refuse|close",
	"What a checkpoint of this --gpucr=on job does with a TCP connection to a "
	"server outside the job: refuse the checkpoint, or close: restore the "
	"connection closed, for the program to reconnect (default: the site's).",
	1,      /* argument required */
	0,
	outside_cb,
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
	struct spank_option *options[] = { &gpucr_option, &interval_option, &outside_option };

	site_cfg = site;
	for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
		spank_err_t rc = spank_option_register(sp, options[i]);

		if (rc != ESPANK_SUCCESS) {
			slurm_error("gpucr: cannot register --%s: %s", options[i]->name,
				    spank_strerror(rc));
			return -1;
		}
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
