/*
 * The user options --gpucr[=on|off], --gpucr-interval and --gpucr-outside.
 */
#ifndef GPUCR_OPTION_H
#define GPUCR_OPTION_H

#include <slurm/spank.h>

#include "site_config.h"

enum gpucr_mode {
	GPUCR_UNSET = 0,   /* option not given */
	GPUCR_ON,
	GPUCR_OFF,
};

/* Environment variable through which sbatch/salloc hand the option to the
 * srun steps of the job (Slurm's naming: SLURM_SPANK__SLURM_SPANK_OPTION_
 * <plugin>_<option>). */
#define GPUCR_OPTION_ENV "SLURM_SPANK__SLURM_SPANK_OPTION_gpucr_gpucr"

/* "on", "off" (and yes/no/true/false/1/0), any case; NULL (bare --gpucr)
 * means on.  Returns GPUCR_ON/GPUCR_OFF or -1 for an invalid value. */
int gpucr_parse_mode(const char *arg);

/* --gpucr-interval=N[smh]|off as given (NULL when not given). */
const char *gpucr_option_interval(void);

/* --gpucr-outside=refuse|close as given (NULL when not given). */
const char *gpucr_option_outside(void);

/* Register --gpucr, --gpucr-interval and --gpucr-outside with Slurm (all contexts
 * that take options). */
int gpucr_option_register(spank_t sp, const struct gpucr_site *site);

/* Mode given on the command line (or replayed by slurmstepd). */
enum gpucr_mode gpucr_option_mode(void);

/* Mode for this step in remote context: the option if Slurm delivered it,
 * else the value left in the step's environment by sbatch/salloc. */
enum gpucr_mode gpucr_option_step_mode(spank_t sp);

#endif
