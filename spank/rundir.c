/*
 * Run dir life cycle.  The plugin works as root inside a directory that the
 * job user owns, so it never follows links there (O_NOFOLLOW, openat) and it
 * removes the user's files with the user's own identity.
 */
#define _GNU_SOURCE
#include "rundir.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define ERR(...) (snprintf(err, errlen, __VA_ARGS__), -1)

/* mkdir -p for the root, root-owned 0755 */
static int mkdir_root(const char *root, char *err, size_t errlen)
{
	char tmp[4096];
	struct stat st;

	if (snprintf(tmp, sizeof(tmp), "%s", root) >= (int)sizeof(tmp))
		return ERR("path too long: %s", root);
	for (char *p = tmp + 1; ; p++) {
		if (*p == '/' || *p == '\0') {
			char c = *p;
			*p = '\0';
			if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
				return ERR("cannot create %s: %s", tmp, strerror(errno));
			*p = c;
			if (c == '\0')
				break;
		}
	}
	if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode))
		return ERR("%s is not a directory", root);
	/* users must not be able to plant a run dir for someone else's job */
	if (st.st_uid != 0 || (st.st_mode & 0022))
		return ERR("run dir root %s must be owned by root and writable only by root "
			   "(plugstack.conf rundir=)", root);
	return 0;
}

static int make_owned_dir(int parentfd, const char *name, const char *shown,
			  uid_t uid, gid_t gid, char *err, size_t errlen)
{
	struct stat st;
	int fd;

	if (mkdirat(parentfd, name, 0700) != 0 && errno != EEXIST)
		return ERR("cannot create %s: %s", shown, strerror(errno));
	fd = openat(parentfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return ERR("cannot open %s: %s", shown, strerror(errno));
	if (fstat(fd, &st) != 0) {
		close(fd);
		return ERR("cannot stat %s: %s", shown, strerror(errno));
	}
	if ((st.st_uid != uid || st.st_gid != gid) && fchown(fd, uid, gid) != 0) {
		close(fd);
		return ERR("cannot chown %s to %u:%u: %s", shown, (unsigned)uid,
			   (unsigned)gid, strerror(errno));
	}
	if ((st.st_mode & 07777) != 0700 && fchmod(fd, 0700) != 0) {
		close(fd);
		return ERR("cannot chmod 0700 %s: %s", shown, strerror(errno));
	}
	return fd;
}

int gpucr_rundir_create(const char *path, uid_t uid, gid_t gid,
			char *err, size_t errlen)
{
	char copy[4096], shown[4200];
	char *root, *name;
	int rootfd, dirfd, tasksfd;

	if (snprintf(copy, sizeof(copy), "%s", path) >= (int)sizeof(copy))
		return ERR("path too long: %s", path);
	name = strrchr(copy, '/');
	if (!name || name == copy)
		return ERR("bad run dir %s", path);
	*name++ = '\0';
	root = copy;
	if (mkdir_root(root, err, errlen) != 0)
		return -1;
	rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		return ERR("cannot open %s: %s", root, strerror(errno));
	dirfd = make_owned_dir(rootfd, name, path, uid, gid, err, errlen);
	close(rootfd);
	if (dirfd < 0)
		return -1;
	snprintf(shown, sizeof(shown), "%s/%s", path, GPUCR_TASKS_DIR);
	tasksfd = make_owned_dir(dirfd, GPUCR_TASKS_DIR, shown, uid, gid, err, errlen);
	close(dirfd);
	if (tasksfd < 0)
		return -1;
	close(tasksfd);
	return 0;
}

static int rm_entry(const char *fpath, const struct stat *sb, int flag,
		    struct FTW *ftw)
{
	(void)sb;
	if (ftw->level == 0)
		return 0;       /* the run dir itself: the parent removes it */
	if (flag == FTW_DP)
		return rmdir(fpath) != 0 && errno != ENOENT;
	return unlink(fpath) != 0 && errno != ENOENT;
}

int gpucr_dir_remove_as_user(const char *path, uid_t uid, gid_t gid,
			     char *err, size_t errlen)
{
	struct stat st;
	pid_t pid;
	int status;

	if (lstat(path, &st) != 0) {
		if (errno == ENOENT)
			return 0;
		return ERR("cannot stat %s: %s", path, strerror(errno));
	}
	if (!S_ISDIR(st.st_mode))
		return ERR("%s is not a directory, left alone", path);
	if (st.st_uid != uid)
		return ERR("%s belongs to uid %u, not to the job's user (uid %u), left alone",
			   path, (unsigned)st.st_uid, (unsigned)uid);

	/* What is in it is the user's: removed by the user, never by root. */
	pid = fork();
	if (pid < 0)
		return ERR("fork: %s", strerror(errno));
	if (pid == 0) {
		if (chdir("/") != 0)
			_exit(2);
		if (setgroups(0, NULL) != 0 && geteuid() == 0)
			_exit(2);
		if (setgid(gid) != 0 || setuid(uid) != 0)
			_exit(2);
		if (getuid() != uid || geteuid() != uid || (uid != 0 && setuid(0) == 0))
			_exit(2);
		_exit(nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0);
	}
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR)
			return ERR("waitpid: %s", strerror(errno));
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return ERR("cannot empty %s as uid %u", path, (unsigned)uid);
	/* Empty now, in a directory only root writes to: root removes the name. */
	if (rmdir(path) != 0 && errno != ENOENT)
		return ERR("cannot remove %s: %s", path, strerror(errno));
	return 0;
}

/* PERSISTING keeps the run dir only when root made it: a plain file of
 * root's, one link, never a symlink (the job's user owns the run dir and
 * could otherwise keep it, and node memory, forever). */
static int persisting(const char *path)
{
	char marker[4200];
	struct stat st;

	snprintf(marker, sizeof(marker), "%s/%s", path, GPUCR_PERSISTING);
	return lstat(marker, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
	       st.st_nlink == 1;
}

int gpucr_rundir_remove(const char *path, uid_t uid, gid_t gid,
			char *err, size_t errlen)
{
	if (persisting(path))  /* root's marker only; a missing or odd run dir: the removal says why */
		return 1;
	return gpucr_dir_remove_as_user(path, uid, gid, err, errlen);
}

int gpucr_task_record(const char *path, const char *step, uint32_t localid,
		      pid_t pid, uint32_t rank, uid_t uid, gid_t gid,
		      char *err, size_t errlen)
{
	char tasks[4200], name[128], tmp[160], text[256];
	int dfd, fd, len;

	snprintf(tasks, sizeof(tasks), "%s/%s", path, GPUCR_TASKS_DIR);
	snprintf(name, sizeof(name), "%s.%u", step, localid);
	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	len = snprintf(text, sizeof(text), "pid=%ld\nrank=%u\nlocal_id=%u\nstep=%s\n",
		       (long)pid, rank, localid, step);

	dfd = open(tasks, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return ERR("cannot open %s: %s", tasks, strerror(errno));
	unlinkat(dfd, tmp, 0);
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		close(dfd);
		return ERR("cannot create %s/%s: %s", tasks, tmp, strerror(errno));
	}
	if (write(fd, text, len) != len || fchown(fd, uid, gid) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		unlinkat(dfd, tmp, 0);
		close(dfd);
		return ERR("cannot write %s/%s: %s", tasks, tmp, strerror(errno));
	}
	if (close(fd) != 0 || renameat(dfd, tmp, dfd, name) != 0) {
		unlinkat(dfd, tmp, 0);
		close(dfd);
		return ERR("cannot rename to %s/%s: %s", tasks, name, strerror(errno));
	}
	close(dfd);
	return 0;
}

int gpucr_task_forget(const char *path, const char *step, uint32_t localid)
{
	char tasks[4200], name[128];
	int dfd, rc;

	snprintf(tasks, sizeof(tasks), "%s/%s", path, GPUCR_TASKS_DIR);
	snprintf(name, sizeof(name), "%s.%u", step, localid);
	dfd = open(tasks, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return -1;
	rc = unlinkat(dfd, name, 0);
	close(dfd);
	return rc == 0 || errno == ENOENT ? 0 : -1;
}
