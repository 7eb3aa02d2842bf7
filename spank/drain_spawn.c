/*
 * The drain of a job's staged checkpoints, started by the job epilog (root).
 *
 * <stage>/<jobid> is the job user's (made by the plugin at step setup,
 * imagedir.c) under a stage root only root writes to.  The drain runs in
 * it and in the job's image dir, both the user's, so it runs as the user:
 * never as root.  A detached keeper (root, in a session of its own, in /)
 * starts it with the user's ids and groups and a clean environment, waits
 * for it, and then removes <stage>/<jobid>: its contents as the user, the
 * name as root (rundir.c), so that nothing a job left in node memory
 * outlives it.  Unless the job is back on this node by then (its run dir is
 * there again): that run's own epilog drains and removes it.
 */
#define _GNU_SOURCE
#include "drain_spawn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "rundir.h"
#include "step_info.h"

#define MAX_GROUPS 1024

/* Whether the dir (opened without following links) holds a generation. */
static int has_generation(const char *dir)
{
	DIR *d;
	struct dirent *e;
	int fd, found = 0;

	fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return 0;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return 0;
	}
	while (!found && (e = readdir(d)) != NULL)
		found = !strncmp(e->d_name, "gen-", 4);
	closedir(d);
	return found;
}

/* The job user's groups, looked up before any fork. */
static int user_groups(uid_t uid, gid_t gid, gid_t *groups, int *n)
{
	struct passwd pw, *res = NULL;
	char buf[16384];

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res) {
		groups[0] = gid;  /* no such user here: their primary group alone */
		*n = 1;
		return 0;
	}
	if (getgrouplist(pw.pw_name, gid, groups, n) < 0)
		return -1;
	return 0;
}

/* In the drain's process: the job's user, for good, or exit. */
static void become_user(uid_t uid, gid_t gid, const gid_t *groups, int ngroups)
{
	if (setgroups((size_t)ngroups, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
		_exit(126);
	if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid)
		_exit(126);
	if (uid != 0 && (setuid(0) == 0 || setegid(0) == 0))
		_exit(126);
}

int gpucr_spawn_drain(const struct gpucr_site *site, uint32_t jobid, uid_t uid, gid_t gid,
		      const char *rundir)
{
	char node[256], root[4096], dir[4200], id[16], conf[4096] = "";
	gid_t groups[MAX_GROUPS];
	int ngroups = MAX_GROUPS, drain;
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
	if (lstat(dir, &st) != 0)
		return 0;
	if (!S_ISDIR(st.st_mode)) {
		slurm_error("gpucr: job %u: %s is not a directory: not drained, left alone", jobid, dir);
		return -1;
	}
	if (st.st_uid != uid) {
		slurm_error("gpucr: job %u: %s belongs to uid %u, not to the job's user (uid %u): "
			    "not drained, left alone", jobid, dir, (unsigned)st.st_uid, (unsigned)uid);
		return -1;
	}
	if (user_groups(uid, gid, groups, &ngroups) != 0) {
		slurm_error("gpucr: job %u: cannot list the groups of uid %u: %s not drained",
			    jobid, (unsigned)uid, dir);
		return -1;
	}
	drain = has_generation(dir);
	if (getenv("SLURM_CONF"))
		snprintf(conf, sizeof(conf), "%s", getenv("SLURM_CONF"));
	snprintf(id, sizeof(id), "%u", jobid);
	pid = fork();
	if (pid < 0) {
		slurm_error("gpucr: job %u: cannot start the drain of %s: fork failed", jobid, dir);
		return -1;
	}
	if (pid == 0) {
		/* Twice forked, in a session of its own: nothing of the epilog waits for it. */
		char err[1024];
		struct stat again;
		pid_t child;
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
		if (chdir("/") != 0)
			_exit(1);
		/* Not the job's environment: the drain is the node's, not a process of the job. */
		clearenv();
		setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
		if (conf[0])
			setenv("SLURM_CONF", conf, 1);
		setenv("SLURMD_NODENAME", node, 1);
		umask(077);
		if (drain) {
			child = fork();
			if (child == 0) {
				become_user(uid, gid, groups, ngroups);
				execl(site->cli, site->cli, "drain", id, (char *)NULL);
				_exit(127);
			}
			if (child > 0)
				while (waitpid(child, &status, 0) < 0 && errno == EINTR)
					;
		}
		/* The job back on this node meanwhile: its own epilog gives the memory back. */
		if (rundir && rundir[0] && lstat(rundir, &again) == 0)
			_exit(0);
		_exit(gpucr_dir_remove_as_user(dir, uid, gid, err, sizeof(err)) != 0);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (drain)
		slurm_info("gpucr: job %u: draining %s to the image root, as uid %u", jobid, dir,
			   (unsigned)uid);
	return drain;
}
