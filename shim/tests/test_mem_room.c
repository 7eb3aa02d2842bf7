/* The host memory the arena may still take (mem_room.c): the tightest memory
 * cgroup limit of the process, read from a cgroup tree made here (v1 and v2
 * files alike, under GPUCR_CGROUP_ROOT) for the process's own cgroup paths; an
 * arena growth that would not fit is refused with the reason, and nothing is
 * added; so are the new files a placement needs for segments staged in a
 * folder (arena_files). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "arena.h"
#include "mem_room.h"

#define MIB (1ull << 20)

static void mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0700);
            *p = '/';
        }
    mkdir(path, 0700);
}

static void put(const char *dir, const char *name, unsigned long long v)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fprintf(f, "%llu\n", v);
    fclose(f);
}

/* Every memory hierarchy of this process gets `room` under its limit, at its own level. */
static void fake_tree(const char *root, unsigned long long room)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    CHECK(f);
    char line[1200];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        char dir[1500];
        if (!c1[1]) {
            snprintf(dir, sizeof dir, "%s%s", root, c2 + 1);
            mkdirs(dir);
            put(dir, "memory.max", 4096 * MIB);
            put(dir, "memory.current", 4096 * MIB - room);
        } else if (strstr(c1 + 1, "memory")) {
            snprintf(dir, sizeof dir, "%s/memory%s", root, c2 + 1);
            mkdirs(dir);
            put(dir, "memory.limit_in_bytes", 4096 * MIB);
            put(dir, "memory.usage_in_bytes", 4096 * MIB - room);
        }
    }
    fclose(f);
}

int main(void)
{
    char root[] = "/tmp/gpucr-cgroup-test-XXXXXX", dir[] = "/tmp/gpucr-arena-room-test-XXXXXX";
    CHECK(mkdtemp(root) && mkdtemp(dir));
    setenv("GPUCR_CGROUP_ROOT", root, 1);
    fake_tree(root, 1024 * MIB);
    char where[1300], why[600];
    size_t room = gpucr_mem_room(where, sizeof where);
    CHECK(room <= 1024 * MIB);
    if (room == 1024 * MIB)
        CHECK(strstr(where, "memory limit of cgroup") != NULL);
    PASS("the room is the cgroup limit less its usage");

    CHECK(gpucr_mem_room_for(512 * MIB, why, sizeof why) == 0 || room < 768 * MIB);
    CHECK(gpucr_mem_room_for(900 * MIB, why, sizeof why) == -1 && strstr(why, "does not fit in") != NULL);
    PASS("a size that leaves less than the reserve is refused with the reason");

    CHECK(gpucr_arena_configure(dir) == 0);
    size_t cap = gpucr_arena_capacity();
    CHECK(gpucr_arena_grow(900 * MIB) == -1 && errno == ENOMEM);
    CHECK(strstr(gpucr_arena_error(), "for the host arena does not fit") != NULL);
    CHECK(gpucr_arena_capacity() == cap && gpucr_arena_segments() == 0);
    CHECK(gpucr_arena_grow(8 * MIB) == 0 && *gpucr_arena_error() == '\0');
    PASS("an arena growth without room is refused, nothing added; one with room goes on");
    gpucr_arena_reset();
    rmdir(dir);

    char shm[] = "/dev/shm/gpucr-arena-room-test-XXXXXX", proc[64], staged[128];
    int fd, fd2, linkable;
    CHECK(mkdtemp(shm) && gpucr_arena_configure(shm) == 0);
    CHECK(gpucr_arena_grow(8 * MIB) == 0 && gpucr_arena_segments() == 2);
    CHECK(gpucr_arena_segment_file(1, &fd, &linkable) == 0 && linkable);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    snprintf(staged, sizeof staged, "%s/staged", shm);
    CHECK(linkat(AT_FDCWD, proc, AT_FDCWD, staged, AT_SYMLINK_FOLLOW) == 0);
    fake_tree(root, 100 * MIB);
    size_t size = MIB;
    void *blob;
    CHECK(gpucr_arena_place(&size, 1, &blob, NULL, NULL) == -1 && errno == ENOMEM);
    CHECK(strstr(gpucr_arena_error(), "staged") && strstr(gpucr_arena_error(), "does not fit"));
    CHECK(gpucr_arena_segment_file(1, &fd2, &linkable) == 0 && fd2 == fd && gpucr_arena_segments() == 2);
    fake_tree(root, 1024 * MIB);
    CHECK(gpucr_arena_place(&size, 1, &blob, NULL, NULL) == 0 && *gpucr_arena_error() == '\0');
    CHECK(gpucr_arena_segment_file(1, &fd2, &linkable) == 0 && fd2 != fd && gpucr_arena_segments() == 2);
    PASS("a staged segment's new file without room is refused with the reason, the segment kept");
    unlink(staged);
    gpucr_arena_destroy(NULL);
    rmdir(shm);
    return 0;
}
