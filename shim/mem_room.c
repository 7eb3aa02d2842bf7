/* How much more host memory this process may take before the kernel's OOM
 * killer steps in: the tightest of its memory cgroups (a Slurm job's limit
 * is one of them) and the node's MemAvailable.
 *
 * The arena lives in /dev/shm, whose pages are charged to the cgroup of the
 * task that touches them. Growing it past the job's limit would not fail an
 * allocation: the OOM killer would end the job. So the arena grows only where
 * there is room (hugetlbfs pages are reserved apart, and are not counted). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mem_room.h"

#define RESERVE (256ul << 20) /* left to the program itself */

static int read_u64(const char *path, unsigned long long *v)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[64] = "";
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || !strncmp(buf, "max", 3))
        return -1; /* "max": no limit at this level */
    char *end;
    errno = 0;
    *v = strtoull(buf, &end, 10);
    return errno || end == buf ? -1 : 0;
}

/* The room under each level from `dir` up to `root`: limit - usage, the least. */
static void walk(const char *root, const char *rel, const char *limit_file, const char *usage_file,
                 size_t *room, char *where, size_t wlen)
{
    char path[1024];
    snprintf(path, sizeof path, "%s%s", root, rel);
    for (;;) {
        char lim[1200], use[1200];
        unsigned long long limit, usage;
        snprintf(lim, sizeof lim, "%s/%s", path, limit_file);
        snprintf(use, sizeof use, "%s/%s", path, usage_file);
        if (read_u64(lim, &limit) == 0 && read_u64(use, &usage) == 0 && limit < (1ull << 62)) {
            size_t r = usage >= limit ? 0 : (size_t)(limit - usage);
            if (r < *room) {
                *room = r;
                snprintf(where, wlen, "the memory limit of cgroup %s (%s)", path[strlen(root)] ? path + strlen(root)
                         : "/", limit_file);
            }
        }
        char *slash = strrchr(path, '/');
        if (!slash || (size_t)(slash - path) < strlen(root))
            return;
        *slash = '\0';
    }
}

size_t gpucr_mem_room(char *where, size_t wlen)
{
    size_t room = SIZE_MAX;
    if (where && wlen)
        where[0] = '\0';
    char scratch[8];
    if (!where) {
        where = scratch;
        wlen = sizeof scratch;
    }
    const char *root = getenv("GPUCR_CGROUP_ROOT"); /* tests; else the usual mount */
    root = root && *root ? root : "/sys/fs/cgroup";
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[1200];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *ctrls = c1 + 1, *rel = c2 + 1;
        char base[1100];
        if (!*ctrls) { /* v2 */
            walk(root, rel, "memory.max", "memory.current", &room, where, wlen);
        } else if (strstr(ctrls, "memory")) { /* v1 */
            snprintf(base, sizeof base, "%s/memory", root);
            walk(base, rel, "memory.limit_in_bytes", "memory.usage_in_bytes", &room, where, wlen);
        }
    }
    if (f)
        fclose(f);
    FILE *m = fopen("/proc/meminfo", "r");
    while (m && fgets(line, sizeof line, m)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 && kb * 1024 < room) {
            room = (size_t)(kb * 1024);
            snprintf(where, wlen, "the node's available memory (MemAvailable)");
        }
    }
    if (m)
        fclose(m);
    return room;
}

int gpucr_mem_room_for(size_t more, char *why, size_t len)
{
    char where[1300];
    size_t room = gpucr_mem_room(where, sizeof where);
    if (room == SIZE_MAX || more + RESERVE <= room)
        return 0;
    snprintf(why, len, "%.2f GiB more for the host arena does not fit in %s: %.2f GiB free there, %.2f GiB of it "
             "kept for the program", more / 1073741824.0, where, room / 1073741824.0, RESERVE / 1073741824.0);
    return -1;
}
