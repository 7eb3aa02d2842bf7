/* The host arena: placement, growth by one segment, reuse without growth
 * (no leak over repeated checkpoints), no files left behind, registration
 * callback, preallocation, cleanup. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "gpucr.h"

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
    CHECK(gpucr_arena_place(sizes, 3, out, reg) == 0);
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
        CHECK(gpucr_arena_place(sizes, 3, out, reg) == 0);
    }
    CHECK(gpucr_arena_capacity() == cap && registered == 1);
    PASS("arena reuse");

    /* a larger footprint grows by one segment, registered once */
    size_t big[2] = {8 << 20, 3 << 20};
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(big, 2, out, reg) == 0);
    CHECK(gpucr_arena_segments() == 2 && registered == 2 && files_in(dir) == 0);
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(big, 2, out, reg) == 0);
    CHECK(gpucr_arena_segments() == 2);
    PASS("arena growth");

    /* preallocated capacity: created unregistered, registered on first use */
    CHECK(gpucr_arena_prealloc(gpucr_arena_capacity() + (4 << 20)) == 0);
    CHECK(gpucr_arena_segments() == 3 && registered == 2);
    CHECK(gpucr_arena_prealloc(1 << 20) == 0 && gpucr_arena_segments() == 3); /* already there */
    size_t more[3] = {8 << 20, 3 << 20, 4 << 20};
    gpucr_arena_reset();
    CHECK(gpucr_arena_place(more, 3, out, reg) == 0);
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

    /* the copy helper's view: with descriptors kept, a segment's file shows
     * what the process wrote at its placements, and another mapping of it
     * writes into them; a detach closes the descriptor, an attach opens a new
     * file (a new generation) */
    int seg, fd;
    size_t off, segsize;
    unsigned gen, gen2;
    CHECK(gpucr_arena_locate(out[0], &seg, &off) == 0 && gpucr_arena_segment(seg, &fd, &segsize, &gen) == -1);
    CHECK(gpucr_arena_locate(line, &seg, &off) == -1); /* not in the arena */
    gpucr_arena_keep_fds();
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
    CHECK(gpucr_arena_attach_files(reg, few, 1) == -1 && errno == EINVAL && gpucr_arena_detached() == n);
    CHECK(fcntl(few[0], F_GETFD) == -1); /* taken, even when refused */
    int wrong = open(dir, O_TMPFILE | O_RDWR, 0600), saved = fds[n - 1];
    CHECK(wrong >= 0 && ftruncate(wrong, 4096) == 0);
    fds[n - 1] = wrong;
    int copy[8];
    for (int i = 0; i < n - 1; i++)
        copy[i] = dup(fds[i]);
    copy[n - 1] = wrong;
    CHECK(gpucr_arena_attach_files(reg, copy, n) == -1 && errno == EINVAL && gpucr_arena_detached() == n);
    fds[n - 1] = saved;
    reg_before = registered;
    CHECK(gpucr_arena_attach_files(reg, fds, n) == 0);
    CHECK(gpucr_arena_detached() == 0 && registered == reg_before + n && files_in(dir) == 0);
    CHECK(memcmp(out[1], "filled", 6) == 0);
    CHECK(gpucr_arena_locate(out[1], &seg, &off) == 0 && gpucr_arena_segment(seg, &fd, &segsize, &gen2) == 0);
    CHECK(fd == fds[seg]); /* kept for the copy helper */
    PASS("arena attach of files filled ahead");

    int unreg_now = unregistered;
    gpucr_arena_destroy(unreg);
    CHECK(unregistered == unreg_now + 3 && files_in(dir) == 0 && gpucr_arena_capacity() == 0);
    rmdir(dir);
    PASS("arena cleanup");
    return 0;
}
