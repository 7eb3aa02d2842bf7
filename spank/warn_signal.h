/*
 * How a --gpucr=on batch job is told to checkpoint itself: its warning
 * signal, as sbatch --signal=B:SIG@SECS would set it.
 */
#ifndef GPUCR_WARN_SIGNAL_H
#define GPUCR_WARN_SIGNAL_H

#include <slurm/spank.h>

#include "site_config.h"

/* Set by the plugin next to SBATCH_SIGNAL, so the job's tasks can drop both
 * (a nested sbatch must not inherit them). */
#define GPUCR_SIGNAL_MARK "GPUCR_SBATCH_SIGNAL_SET"

/* sbatch, before its options are read: request the warning signal when its
 * command line says --gpucr=on. */
void gpucr_warn_signal_from_cmdline(const struct gpucr_site *site);

/* sbatch, from the option callback (an #SBATCH --gpucr=on line). */
void gpucr_warn_signal_request(const struct gpucr_site *site);

/* Remote task: drop what the two above put in the job's environment. */
void gpucr_warn_signal_forget(spank_t sp);

#endif
