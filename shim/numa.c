/* NUMA placement: the host arena and the threads that copy between the GPU and
 * it go on the GPU's own NUMA node.
 *
 * Why: on a node with several GPUs, one process per GPU checkpoints at once; if
 * their arenas and copy threads all land on one socket, 4-8 processes share that
 * socket's memory bandwidth and cross the link between sockets. On each GPU's
 * own node they do not.
 *
 * The GPU is the device of the calling thread's current context (numa_gpu.c
 * asks the driver for its PCI bus id); sysfs names its node and the node's CPUs.
 * Memory is bound with MPOL_PREFERRED, so an allocation never fails for lack of
 * room on that node (the kernel takes another); threads are pinned to the
 * node's CPUs that the process may use. Placement is an optimisation: a failure
 * is noted (gpucr_numa_error, the status's numa_error) and otherwise ignored.
 * Off with GPUCR_NUMA=0; nothing happens where the GPU's node is unknown (-1) or
 * the machine has one node. No libnuma: raw syscalls. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "numa.h"

#define MAX_NODES 1024

int (*gpucr_numa_gpu_busid)(char *busid, size_t len);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char root[256] = "/sys";
static int resolved; /* node settled (a GPU found, or off, or one node) */
static int node = -1;
static cpu_set_t node_cpus;
static char error[200]; /* the last placement failure, "" when none */

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, sizeof error, fmt, ap);
    va_end(ap);
    gpucr_log("numa: %s", error);
}

/* The first line of a small sysfs file, without its newline: 0, or -1. */
static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char *got = fgets(buf, (int)len, f);
    fclose(f);
    if (!got)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

int gpucr_numa_parse_cpulist(const char *list, cpu_set_t *set)
{
    CPU_ZERO(set);
    const char *s = list;
    while (*s && *s != '\n') {
        char *end;
        if (!isdigit((unsigned char)*s))
            return -1;
        unsigned long a = strtoul(s, &end, 10), b = a;
        if (*end == '-') {
            if (!isdigit((unsigned char)end[1]))
                return -1;
            b = strtoul(end + 1, &end, 10);
        }
        if (b < a || (*end && *end != ',' && *end != '\n'))
            return -1;
        for (unsigned long c = a; c <= b && c < CPU_SETSIZE; c++)
            CPU_SET(c, set);
        s = *end == ',' ? end + 1 : end;
    }
    return CPU_COUNT(set);
}

int gpucr_numa_pci_node(const char *sysfs, const char *busid)
{
    unsigned dom, bus, dev, fn;
    char path[512], buf[32];
    if (sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
        return -1;
    /* sysfs spells it 0000:3b:00.0; the driver may say 00000000:3B:00.0 */
    snprintf(path, sizeof path, "%s/bus/pci/devices/%04x:%02x:%02x.%x/numa_node", sysfs, dom, bus, dev, fn);
    if (read_line(path, buf, sizeof buf) != 0)
        return -1;
    int n = atoi(buf);
    return n >= 0 && n < MAX_NODES ? n : -1;
}

int gpucr_numa_node_cpus(const char *sysfs, int n, cpu_set_t *set)
{
    char path[512], buf[4096];
    snprintf(path, sizeof path, "%s/devices/system/node/node%d/cpulist", sysfs, n);
    if (read_line(path, buf, sizeof buf) != 0) {
        CPU_ZERO(set);
        return -1;
    }
    return gpucr_numa_parse_cpulist(buf, set);
}

/* Nodes online (the node list has the cpulist format); 1 when unreadable. */
static int nodes_online(void)
{
    char path[512], buf[4096];
    cpu_set_t set;
    snprintf(path, sizeof path, "%s/devices/system/node/online", root);
    if (read_line(path, buf, sizeof buf) != 0)
        return 1;
    int n = gpucr_numa_parse_cpulist(buf, &set);
    return n < 1 ? 1 : n;
}

static int enabled(void)
{
    const char *v = getenv("GPUCR_NUMA");
    return !(v && (!strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "false")));
}

/* Settles the node once a GPU can be named; callers hold mu. */
static void resolve_locked(void)
{
    char busid[64];
    if (!enabled() || nodes_online() < 2) {
        node = -1;
        resolved = 1;
        return;
    }
    if (!gpucr_numa_gpu_busid || gpucr_numa_gpu_busid(busid, sizeof busid) != 0)
        return; /* no GPU to ask about yet (no context): later */
    node = gpucr_numa_pci_node(root, busid);
    if (node >= 0 && gpucr_numa_node_cpus(root, node, &node_cpus) < 0)
        CPU_ZERO(&node_cpus);
    resolved = 1;
    gpucr_log("numa: GPU %s is on node %d (%d CPUs)", busid, node, node >= 0 ? CPU_COUNT(&node_cpus) : 0);
}

int gpucr_numa_node(void)
{
    pthread_mutex_lock(&mu);
    if (!resolved)
        resolve_locked();
    int n = node;
    pthread_mutex_unlock(&mu);
    return n;
}

int gpucr_numa_node_known(void)
{
    pthread_mutex_lock(&mu);
    int n = resolved ? node : -1;
    pthread_mutex_unlock(&mu);
    return n;
}

const char *gpucr_numa_error(void) { return error; }

int gpucr_numa_bind_to(void *p, size_t len, int n)
{
    unsigned long mask[MAX_NODES / (8 * sizeof(unsigned long))] = {0};
    if (n < 0 || n >= MAX_NODES) {
        errno = EINVAL;
        return -1;
    }
    mask[n / (8 * sizeof(unsigned long))] = 1ul << (n % (8 * sizeof(unsigned long)));
    /* maxnode + 1, as the kernel counts it (libnuma does the same) */
    return syscall(SYS_mbind, p, len, MPOL_PREFERRED, mask, sizeof mask * 8 + 1, 0) == 0 ? 0 : -1;
}

void gpucr_numa_bind(void *p, size_t len)
{
    int n = gpucr_numa_node();
    if (n >= 0 && gpucr_numa_bind_to(p, len, n) != 0)
        note("binding %zu bytes to node %d failed (%s)", len, n, strerror(errno));
}

void gpucr_numa_pin_thread(void)
{
    int n = gpucr_numa_node();
    if (n < 0)
        return;
    cpu_set_t allowed, use;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        note("reading the thread's CPUs failed (%s)", strerror(errno));
        return;
    }
    pthread_mutex_lock(&mu);
    CPU_AND(&use, &allowed, &node_cpus);
    pthread_mutex_unlock(&mu);
    if (CPU_COUNT(&use) == 0) /* the job was given none of them: stay where allowed */
        return;
    if (sched_setaffinity(0, sizeof use, &use) != 0)
        note("pinning a copy thread to node %d failed (%s)", n, strerror(errno));
}

void gpucr_numa_reset(const char *sysfs)
{
    pthread_mutex_lock(&mu);
    if (sysfs && strlen(sysfs) < sizeof root)
        strcpy(root, sysfs);
    resolved = 0;
    node = -1;
    CPU_ZERO(&node_cpus);
    error[0] = '\0';
    pthread_mutex_unlock(&mu);
}

void gpucr_numa_after_fork_child(void) { pthread_mutex_init(&mu, NULL); }
