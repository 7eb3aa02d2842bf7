/*
 * Automatic checkpoint before preemption or the time limit.
 *
 * With PreemptParameters=send_user_signal, Slurm sends a preempted job its
 * warning signal (--signal) at the start of the grace time instead of
 * SIGTERM, and it sends the same signal SECS before the time limit.  "B:"
 * sends it to the batch step's task alone, which for a --gpucr=on job is the
 * gpucr-hpc supervisor: it checkpoints and requeues the job, and no user
 * process ever sees the signal.
 *
 * A SPANK plugin cannot set sbatch options, but sbatch reads SBATCH_SIGNAL
 * after the #SBATCH lines and before the command line.  So: for --gpucr=on
 * in an #SBATCH line, the option callback sets SBATCH_SIGNAL; for --gpucr=on
 * on the command line (parsed after the environment), plugin init reads
 * sbatch's own command line first.  Never overwritten: the user's own
 * SBATCH_SIGNAL or --signal on the command line wins (documented: the job
 * is then not checkpointed automatically).
 */
#include "warn_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "option.h"

extern char *program_invocation_short_name;

static int in_sbatch(void)
{
	return strcmp(program_invocation_short_name, "sbatch") == 0;
}

void gpucr_warn_signal_request(const struct gpucr_site *site)
{
	char value[64];

	if (!in_sbatch() || !strcmp(site->signal, "off") || getenv("SBATCH_SIGNAL"))
		return;
	snprintf(value, sizeof(value), "B:%s", site->signal);
	setenv("SBATCH_SIGNAL", value, 0);
	setenv(GPUCR_SIGNAL_MARK, "1", 1);
}

/* The last --gpucr[=VALUE] on sbatch's command line.  Where the options end
 * cannot be told without sbatch's own option table (-o FILE ...), so the
 * script's arguments are read too: one of them spelling --gpucr=on would
 * only add a warning signal to a job that does not use it. */
static enum gpucr_mode cmdline_mode(const char *args, size_t len)
{
	enum gpucr_mode mode = GPUCR_UNSET;
	const char *a = args + strlen(args) + 1;   /* skip argv[0] */

	for (; a < args + len; a += strlen(a) + 1) {
		if (!strcmp(a, "--gpucr"))
			mode = GPUCR_ON;
		else if (!strncmp(a, "--gpucr=", 8)) {
			int m = gpucr_parse_mode(a + 8);
			if (m > 0)
				mode = (enum gpucr_mode)m;
		}
	}
	return mode;
}

void gpucr_warn_signal_from_cmdline(const struct gpucr_site *site)
{
	static char args[65536];
	ssize_t n, len = 0;
	int fd;

	if (!in_sbatch())
		return;
	fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	while (len < (ssize_t)sizeof(args) - 1 &&
	       ((n = read(fd, args + len, sizeof(args) - 1 - len)) > 0 || (n < 0 && errno == EINTR)))
		len += n > 0 ? n : 0;
	close(fd);
	args[len] = '\0';
	if (len > 0 && cmdline_mode(args, (size_t)len) == GPUCR_ON)
		gpucr_warn_signal_request(site);
}

void gpucr_warn_signal_forget(spank_t sp)
{
	char mark[8];

	if (spank_getenv(sp, GPUCR_SIGNAL_MARK, mark, sizeof(mark)) != ESPANK_SUCCESS)
		return;
	spank_unsetenv(sp, "SBATCH_SIGNAL");
	spank_unsetenv(sp, GPUCR_SIGNAL_MARK);
}
