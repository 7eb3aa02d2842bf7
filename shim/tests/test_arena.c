/* The host arena: placement, growth by one segment, reuse without growth
 * (no leak over repeated checkpoints), no files left behind, registration
 * callback, preallocation, cleanup; segment files linked into a stage folder
 * (arena_files) and a placement's new files for them. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "arena.h"

static int registered, unregistered;
static int reg(void *b, size_t s) { (void)b; (void)s; registered++; return 0; }
static int unreg(void *b, size_t s) { (void)b; (void)s; unregistered++; return 0; }

static int files_in(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, "gpucr-arena-", 12) == 0;
    closedir(d);
    return n;
}

static char byte_at(int fd, size_t off)
{
    char b = 0;
    CHECK(pread(fd, &b, 1, (off_t)off) == 1);
    return b;
}

static int nlink_of(int fd)
{
    struct stat st;
    CHECK(fstat(fd, &st) == 0);
    return (int)st.st_nlink;
}

/* The agent's side of a preemption: a segment made in tmpfs is linked into a
 * stage folder through /proc/self/fd (no copy); the next placement gives it a
 * new file at the same range, so the staged file keeps its bytes; a segment
 * linked nowhere keeps its file. Then the restore's side: the staged file
 * attached as the segment, and again a new file before anything is written. */
static void staged_segments(void)
{
    char dir[] = "/dev/shm/gpucr-arena-stage-test-XXXXXX", stage[] = "/dev/shm/gpucr-stage-test-XXXXXX";
    CHECK(mkdtemp(dir) && mkdtemp(stage));
    CHECK(gpucr_arena_configure(dir) == 0);
    size_t size = 3 << 20, off, segsize;
    void *blob, *again;
    int seg, fd, fd2, linkable;
    unsigned gen, gen2;
    CHECK(gpucr_arena_place(&size, 1, &blob, reg, unreg) == 0 && gpucr_arena_segments() == 1);
    CHECK(gpucr_arena_locate(blob, &seg, &off) == 0 && gpucr_arena_segment(seg, &fd, &segsize, &gen) == 0);
    CHECK(gpucr_arena_segment_file(seg, &fd2, &linkable) == 0 && fd2 == fd && linkable && nlink_of(fd) == 0);
    memset(blob, 'o', size);

    /* linked nowhere: the same file, the same bytes after the next placement */
    int reg_before = registered, unreg_before = unregistered;
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(&size, 1, &again, reg, unreg) == 0 && again == blob);
    CHECK(gpucr_arena_segment(seg, &fd2, &segsize, &gen2) == 0 && fd2 == fd && gen2 == gen);
    CHECK(((char *)blob)[0] == 'o' && registered == reg_before && unregistered == unreg_before);
    PASS("arena segment linked nowhere: kept by a placement");

    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int sd = open(stage, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    CHECK(sd >= 0 && linkat(AT_FDCWD, proc, sd, "seg0", AT_SYMLINK_FOLLOW) == 0);
    int staged = openat(sd, "seg0", O_RDWR | O_CLOEXEC);
    struct stat st;
    CHECK(staged >= 0 && fstat(staged, &st) == 0 && (size_t)st.st_size == segsize && st.st_nlink == 1);
    CHECK(byte_at(staged, off) == 'o' && byte_at(staged, off + size - 1) == 'o');
    CHECK(gpucr_arena_segment_file(seg, &fd2, &linkable) == 0 && fd2 == fd && linkable);
    PASS("arena segment in tmpfs linked into a stage folder");

    /* the shim links them itself (its own mounts): all of them, or none */
    char into[sizeof stage + 8];
    snprintf(into, sizeof into, "%s/own", stage);
    CHECK(gpucr_arena_link_into(into) == -1 && errno == ENOENT);
    CHECK(mkdir(into, 0700) == 0 && gpucr_arena_link_into(into) == 0);
    struct stat own;
    CHECK(fstatat(sd, "own/0", &own, 0) == 0 && fstat(fd, &st) == 0 && own.st_ino == st.st_ino);
    CHECK(gpucr_arena_link_into(into) == -1 && errno == EEXIST && fstatat(sd, "own/0", &own, 0) == 0);
    CHECK(unlinkat(sd, "own/0", 0) == 0 && unlinkat(sd, "own", AT_REMOVEDIR) == 0);
    PASS("arena files linked by the shim into a folder");

    uintptr_t base, base2;
    size_t bound = gpucr_arena_bounds(seg, &base);
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(&size, 1, &again, reg, unreg) == 0 && again == blob);
    CHECK(gpucr_arena_bounds(seg, &base2) == bound && base2 == base && gpucr_arena_segments() == 1);
    CHECK(gpucr_arena_segment(seg, &fd2, &segsize, &gen2) == 0 && fd2 != fd && gen2 != gen);
    CHECK(fcntl(fd, F_GETFD) == -1 && nlink_of(fd2) == 0); /* the old one closed; the new one linked nowhere */
    CHECK(unregistered == unreg_before + 1 && registered == reg_before + 1); /* pinned again */
    memset(again, 'n', size);
    CHECK(byte_at(staged, off) == 'o' && byte_at(staged, off + size - 1) == 'o' && byte_at(fd2, off) == 'n');
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(&size, 1, &again, reg, unreg) == 0 && gpucr_arena_segment(seg, &fd, &segsize, &gen) == 0);
    CHECK(fd == fd2 && gen == gen2 && ((char *)again)[0] == 'n'); /* linked nowhere now */
    PASS("arena placement gives a linked segment a new file at the same range");

    /* the restore on the same node: the staged file is the segment again;
     * linked, so the next placement moves off it before anything is written */
    CHECK(gpucr_arena_detach(unreg) == 0);
    CHECK(gpucr_arena_attach_files(reg, &staged, 1, 0) == 0 && ((char *)blob)[0] == 'o');
    CHECK(gpucr_arena_segment_file(seg, &fd, &linkable) == 0 && fd == staged && linkable);
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(&size, 1, &again, reg, unreg) == 0 && again == blob);
    CHECK(gpucr_arena_segment_file(seg, &fd, &linkable) == 0 && fd != staged && linkable);
    memset(again, 'r', size);
    staged = openat(sd, "seg0", O_RDONLY | O_CLOEXEC);
    CHECK(staged >= 0 && byte_at(staged, off) == 'o');
    close(staged);
    PASS("arena attached from a stage folder moves off it before a placement");

    /* the drain done before the next checkpoint: the staged file lost its name,
     * and the kernel lets it get none again; while the program runs, the
     * refresh gives the segment a new file that a preemption can link */
    CHECK(gpucr_arena_detach(unreg) == 0);
    staged = openat(sd, "seg0", O_RDWR | O_CLOEXEC);
    CHECK(staged >= 0 && gpucr_arena_attach_files(reg, &staged, 1, 0) == 0 && ((char *)blob)[0] == 'o');
    CHECK(gpucr_arena_refresh(reg, unreg) == 0); /* still linked: left to the drain */
    CHECK(unlinkat(sd, "seg0", 0) == 0);
    CHECK(gpucr_arena_segment_file(seg, &fd, &linkable) == 0 && fd == staged && !linkable);
    CHECK(gpucr_arena_refresh(reg, unreg) == 1 && fcntl(staged, F_GETFD) == -1);
    CHECK(gpucr_arena_segment_file(seg, &fd, &linkable) == 0 && fd != staged && linkable && nlink_of(fd) == 0);
    CHECK(gpucr_arena_bounds(seg, &base2) == bound && base2 == base);
    CHECK(gpucr_arena_refresh(reg, unreg) == 0); /* nothing left to do */
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    CHECK(linkat(AT_FDCWD, proc, sd, "seg0", AT_SYMLINK_FOLLOW) == 0);
    PASS("arena refresh: a file mapped from a drained stage gets one a preemption can link");

    /* files a restore filled ahead, made with O_TMPFILE and never named: kept */
    CHECK(gpucr_arena_detach(unreg) == 0);
    int filled = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    CHECK(filled >= 0 && ftruncate(filled, (off_t)segsize) == 0);
    CHECK(gpucr_arena_attach_files(reg, &filled, 1, 1) == 0);
    CHECK(gpucr_arena_segment_file(seg, &fd, &linkable) == 0 && fd == filled && linkable);
    CHECK(gpucr_arena_refresh(reg, unreg) == 0);
    CHECK(gpucr_arena_segment_file(seg, &fd, &linkable) == 0 && fd == filled);
    PASS("arena attach of files made to be linked keeps them as they are");

    /* the program closed the segment's descriptor and opened another file at
     * that number: never handed out nor closed as ours; a new file next time */
    int other = open(stage, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    CHECK(other >= 0 && dup2(other, fd) == fd);
    CHECK(gpucr_arena_segment_file(seg, &fd2, &linkable) == -1 && fd2 == -1);
    CHECK(gpucr_arena_segment(seg, &fd2, &segsize, &gen) == -1);
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(&size, 1, &again, reg, unreg) == 0 && again == blob);
    CHECK(gpucr_arena_segment_file(seg, &fd2, &linkable) == 0 && fd2 != fd && fcntl(fd, F_GETFD) != -1);
    close(fd);
    close(other);
    PASS("arena segment whose descriptor the program reused");

    gpucr_arena_destroy(unreg);
    CHECK(unlinkat(sd, "seg0", 0) == 0);
    close(sd);
    rmdir(stage);
    rmdir(dir);
}

int main(void)
{
    char dir[] = "/tmp/gpucr-arena-test-XXXXXX";
    CHECK(mkdtemp(dir));
    CHECK(gpucr_arena_configure(dir) == 0);
    CHECK(strcmp(gpucr_arena_dir(), dir) == 0);
    CHECK(gpucr_arena_configure("/nonexistent/dir") == -1);
    CHECK(strcmp(gpucr_arena_dir(), dir) == 0);

    size_t sizes[3] = {3 << 20, 5000, 1 << 20};
    void *out[3];
    CHECK(gpucr_arena_place(sizes, 3, out, reg, unreg) == 0);
    CHECK(registered == 1 && gpucr_arena_segments() == 1);
    CHECK(files_in(dir) == 0); /* unlinked once mapped: nothing left if the process dies */
    size_t cap = gpucr_arena_capacity();
    CHECK(cap >= sizes[0] + sizes[1] + sizes[2]);
    /* blobs do not overlap and are writable */
    for (int i = 0; i < 3; i++)
        memset(out[i], 'a' + i, sizes[i]);
    CHECK(((char *)out[0])[sizes[0] - 1] == 'a' && ((char *)out[2])[0] == 'c');
    CHECK((char *)out[1] >= (char *)out[0] + sizes[0]);
    CHECK((char *)out[2] >= (char *)out[1] + sizes[1]);

    /* the same footprint again, 20 times: no growth */
    for (int cycle = 0; cycle < 20; cycle++) {
        gpucr_arena_reset();
        CHECK(gpucr_arena_used() == 0);
        CHECK(gpucr_arena_place(sizes, 3, out, reg, unreg) == 0);
    }
    CHECK(gpucr_arena_capacity() == cap && registered == 1);
    PASS("arena reuse");

    /* a larger footprint grows by one segment, registered once */
    size_t big[2] = {8 << 20, 3 << 20};
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(big, 2, out, reg, unreg) == 0);
    CHECK(gpucr_arena_segments() == 2 && registered == 2 && files_in(dir) == 0);
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(big, 2, out, reg, unreg) == 0);
    CHECK(gpucr_arena_segments() == 2);
    PASS("arena growth");

    /* preallocated capacity: created unregistered, registered on first use */
    CHECK(gpucr_arena_prealloc(gpucr_arena_capacity() + (4 << 20)) == 0);
    CHECK(gpucr_arena_segments() == 3 && registered == 2);
    CHECK(gpucr_arena_prealloc(1 << 20) == 0 && gpucr_arena_segments() == 3); /* already there */
    size_t more[3] = {8 << 20, 3 << 20, 4 << 20};
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(more, 3, out, reg, unreg) == 0);
    CHECK(gpucr_arena_segments() == 3 && registered == 3);
    PASS("arena preallocation");

    /* migration: detach leaves an inaccessible reservation of each range (no
     * file, no data), attach brings zero-filled, registered memory back at the
     * same addresses */
    memset(out[0], 'x', more[0]);
    int unreg_before = unregistered;
    CHECK(gpucr_arena_detach(unreg) == 0);
    CHECK(gpucr_arena_detached() == 3 && unregistered == unreg_before + 3);
    char line[512];
    int reserved = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= (unsigned long)out[0] &&
            (unsigned long)out[0] < hi)
            reserved = !strcmp(perms, "---p") && !strstr(line, "gpucr-arena");
    }
    fclose(maps);
    CHECK(reserved);
    CHECK(gpucr_arena_detach(unreg) == 0 && unregistered == unreg_before + 3); /* idempotent */
    int reg_before = registered;
    CHECK(gpucr_arena_attach(reg) == 0);
    CHECK(gpucr_arena_detached() == 0 && registered == reg_before + 3 && files_in(dir) == 0);
    CHECK(((char *)out[0])[0] == 0 && ((char *)out[0])[more[0] - 1] == 0);
    memset(out[0], 'y', more[0]);
    CHECK(gpucr_arena_segments() == 3);
    PASS("arena detach/attach");

    /* every mapped segment keeps its descriptor; a detach closes them all */
    int seg, fd, segfd[3], linkable;
    size_t off, segsize;
    unsigned gen, gen2;
    for (int i = 0; i < 3; i++) {
        CHECK(gpucr_arena_segment(i, &segfd[i], &segsize, &gen) == 0 && fcntl(segfd[i], F_GETFD) == FD_CLOEXEC);
        CHECK(gpucr_arena_segment_file(i, &fd, &linkable) == 0 && fd == segfd[i]);
    }
    CHECK(gpucr_arena_segment_file(3, &fd, &linkable) == -1 && fd == -1 && !linkable);
    CHECK(gpucr_arena_detach(unreg) == 0);
    for (int i = 0; i < 3; i++)
        CHECK(fcntl(segfd[i], F_GETFD) == -1 && gpucr_arena_segment_file(i, &fd, &linkable) == -1 && fd == -1);
    CHECK(gpucr_arena_attach(reg) == 0 && gpucr_arena_segment_file(0, &fd, &linkable) == 0 && fd >= 0);
    PASS("arena segments keep their descriptors while mapped");

    /* the copy helper's view: a segment's file shows what the process wrote at
     * its placements, and another mapping of it writes into them; a detach
     * closes the descriptor, an attach opens a new file (a new generation) */
    CHECK(gpucr_arena_locate(line, &seg, &off) == -1); /* not in the arena */
    CHECK(gpucr_arena_detach(unreg) == 0 && gpucr_arena_attach(reg) == 0);
    memset(out[1], 'z', more[1]);
    CHECK(gpucr_arena_locate((char *)out[1] + 5, &seg, &off) == 0);
    CHECK(gpucr_arena_segment(seg, &fd, &segsize, &gen) == 0 && off + more[1] - 5 <= segsize);
    char *view = mmap(NULL, segsize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(view != MAP_FAILED && view[off] == 'z' && view[off + more[1] - 6] == 'z');
    view[off] = 'w';
    CHECK(((char *)out[1])[5] == 'w');
    munmap(view, segsize);
    CHECK(gpucr_arena_detach(unreg) == 0 && gpucr_arena_segment(seg, &fd, &segsize, &gen2) == -1);
    CHECK(gpucr_arena_attach(reg) == 0 && gpucr_arena_segment(seg, &fd, &segsize, &gen2) == 0 && gen2 != gen);
    CHECK(files_in(dir) == 0);
    PASS("arena segments shared with a copy helper");

    /* a restore that filled the segments' files ahead: attach maps them as they
     * are, at the same addresses, and takes every descriptor */
    int n = gpucr_arena_segments(), fds[8];
    CHECK(gpucr_arena_detach(unreg) == 0);
    for (int i = 0; i < n; i++) {
        uintptr_t base;
        size_t size = gpucr_arena_bounds(i, &base);
        fds[i] = open(dir, O_TMPFILE | O_RDWR, 0600);
        CHECK(size > 0 && fds[i] >= 0 && ftruncate(fds[i], (off_t)size) == 0);
        uintptr_t at = (uintptr_t)out[1];
        if (at >= base && at < base + size) /* where blob 1 lies */
            CHECK(pwrite(fds[i], "filled", 6, (off_t)(at - base)) == 6);
    }
    int few[1] = {dup(fds[0])};
    CHECK(gpucr_arena_attach_files(reg, few, 1, 0) == -1 && errno == EINVAL && gpucr_arena_detached() == n);
    CHECK(fcntl(few[0], F_GETFD) == -1); /* taken, even when refused */
    int wrong = open(dir, O_TMPFILE | O_RDWR, 0600), saved = fds[n - 1];
    CHECK(wrong >= 0 && ftruncate(wrong, 4096) == 0);
    fds[n - 1] = wrong;
    int copy[8];
    for (int i = 0; i < n - 1; i++)
        copy[i] = dup(fds[i]);
    copy[n - 1] = wrong;
    CHECK(gpucr_arena_attach_files(reg, copy, n, 0) == -1 && errno == EINVAL && gpucr_arena_detached() == n);
    fds[n - 1] = saved;
    reg_before = registered;
    CHECK(gpucr_arena_attach_files(reg, fds, n, 0) == 0);
    CHECK(gpucr_arena_detached() == 0 && registered == reg_before + n && files_in(dir) == 0);
    CHECK(memcmp(out[1], "filled", 6) == 0);
    CHECK(gpucr_arena_locate(out[1], &seg, &off) == 0 && gpucr_arena_segment(seg, &fd, &segsize, &gen2) == 0);
    CHECK(fd == fds[seg]); /* kept for the copy helper */
    for (int i = 0; i < n; i++) /* every one kept; no name, not made here: not known to be linkable */
        CHECK(gpucr_arena_segment_file(i, &fd, &linkable) == 0 && fd == fds[i] && !linkable);
    PASS("arena attach of files filled ahead");

    int unreg_now = unregistered;
    gpucr_arena_destroy(unreg);
    CHECK(unregistered == unreg_now + 3 && files_in(dir) == 0 && gpucr_arena_capacity() == 0);
    rmdir(dir);
    PASS("arena cleanup");
    staged_segments();
    return 0;
}
