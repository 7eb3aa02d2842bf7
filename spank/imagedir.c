/*
 * A job's own directory under a root the site gives: the job's image dir
 * <imageroot>/<jobid>, and its staging dir <stage>/<jobid> in node memory.
 *
 * Made here, as root, when a --gpucr=on step starts, before any of the job's
 * own processes runs: owned by the job's user, mode 0700, so no other user
 * can create, rename or delete anything in it.  One that is already there
 * must be the job user's and writable by no one else (another user may have
 * made it ahead of the job under a root of mode 1777, or root left it from
 * an earlier job of the same id); else it is refused, never used, and never
 * changed.  Never through a symlink: the directory is opened with O_NOFOLLOW
 * and checked on that descriptor.
 */
#define _GNU_SOURCE
#include "imagedir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ERR(...) (snprintf(err, errlen, __VA_ARGS__), -1)
#define FIX "it was not made by gpucr-hpc and is not used; ask an admin to move it away, then resubmit the job"

static int check_existing(int fd, const char *path, uid_t uid, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) != 0)
		return ERR("cannot stat %s: %s", path, strerror(errno));
	if (st.st_uid != uid)
		return ERR("%s belongs to uid %u, not to the job's user (uid %u): %s",
			   path, (unsigned)st.st_uid, (unsigned)uid, FIX);
	if (st.st_mode & 0022)
		return ERR("%s is writable by other users (mode %04o): %s",
			   path, (unsigned)(st.st_mode & 07777), FIX);
	/* The user's own, written by no one else: only make it private. */
	if ((st.st_mode & 0077) && fchmod(fd, 0700) != 0)
		return ERR("cannot chmod 0700 %s: %s", path, strerror(errno));
	return 0;
}

/* root/<jobid> for the job's user; setting: the plugstack.conf argument that names root. */
static int job_dir_create(const char *root, const char *label, const char *setting, uint32_t jobid,
			  uid_t uid, gid_t gid, int root_only, char *err, size_t errlen)
{
	char name[16], path[4200];
	struct stat st;
	int rootfd, fd, made, rc;

	snprintf(name, sizeof(name), "%u", jobid);
	snprintf(path, sizeof(path), "%s/%s", root, name);
	rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		return ERR("cannot open the %s %s: %s (plugstack.conf %s=)", label, root,
			   strerror(errno), setting);
	/* A root users can write to lets them plant, fill or swap what is in it. */
	if (root_only && (fstat(rootfd, &st) != 0 || st.st_uid != 0 || (st.st_mode & 0022))) {
		close(rootfd);
		return ERR("the %s %s must be owned by root and writable only by root "
			   "(plugstack.conf %s=; chown root %s; chmod 0755 %s)", label, root, setting,
			   root, root);
	}
	made = mkdirat(rootfd, name, 0700) == 0;
	if (!made && errno != EEXIST) {
		rc = ERR("cannot create %s: %s (the %s must let root create directories: "
			 "plugstack.conf %s=)", path, strerror(errno), label, setting);
		close(rootfd);
		return rc;
	}
	fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		rc = ERR("%s is not a directory (%s): %s", path, strerror(errno), FIX);
		close(rootfd);
		return rc;
	}
	if (made && (fchown(fd, uid, gid) != 0 || fchmod(fd, 0700) != 0)) {
		rc = ERR("cannot give %s to uid %u: %s (root squash on plugstack.conf %s=?)",
			 path, (unsigned)uid, strerror(errno), setting);
		close(fd);
		unlinkat(rootfd, name, AT_REMOVEDIR);  /* ours, empty: not left to refuse the next run */
		close(rootfd);
		return rc;
	}
	close(rootfd);
	rc = check_existing(fd, path, uid, err, errlen);
	close(fd);
	return rc;
}

int gpucr_imagedir_create(const char *imageroot, uint32_t jobid, uid_t uid,
			  gid_t gid, char *err, size_t errlen)
{
	return job_dir_create(imageroot, "image root", "imageroot", jobid, uid, gid, 0, err, errlen);
}

int gpucr_stagedir_create(const char *stage, uint32_t jobid, uid_t uid,
			  gid_t gid, char *err, size_t errlen)
{
	return job_dir_create(stage, "staging dir", "stage", jobid, uid, gid, 1, err, errlen);
}
