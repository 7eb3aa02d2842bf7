#include "drain_spawn.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "step_info.h"

int gpucr_spawn_drain(const struct gpucr_site *site, uint32_t jobid)
{
	char node[256], root[4096], dir[4200], id[16];
	struct stat st;
	pid_t pid;
	int status;

	if (!site->stage[0])
		return 0;
	if (gpucr_node_name(node, sizeof(node)) != 0 ||
	    gpucr_expand_path(site->stage, node, root, sizeof(root)) != 0) {
		slurm_error("gpucr: job %u: cannot name the staging dir (stage=%s)", jobid, site->stage);
		return -1;
	}
	snprintf(dir, sizeof(dir), "%s/%u", root, jobid);
	if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return 0;
	snprintf(id, sizeof(id), "%u", jobid);
	pid = fork();
	if (pid < 0) {
		slurm_error("gpucr: job %u: cannot start the drain of %s: fork failed", jobid, dir);
		return -1;
	}
	if (pid == 0) {
		/* Twice forked, in a session of its own: nothing of the epilog waits for it. */
		int fd;

		setsid();
		if (fork() != 0)
			_exit(0);
		fd = open("/dev/null", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
			dup2(fd, 2);
		}
		for (int i = 3; i < 1024; i++)
			close(i);
		/* Not the job's environment: the drain is the node's, not a process of the job. */
		{
			const char *conf = getenv("SLURM_CONF");
			char keep[4096] = "";

			if (conf)
				snprintf(keep, sizeof(keep), "%s", conf);
			clearenv();
			setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
			if (keep[0])
				setenv("SLURM_CONF", keep, 1);
			setenv("SLURMD_NODENAME", node, 1);
		}
		execl(site->cli, site->cli, "drain", id, (char *)NULL);
		_exit(127);
	}
	while (waitpid(pid, &status, 0) < 0)
		;
	slurm_info("gpucr: job %u: draining %s to the image root", jobid, dir);
	return 1;
}
