/* NUMA placement (numa.c) against a fake sysfs tree: cpulists, a GPU's node by
 * its PCI bus id, memory bound to the node before it is touched (the policy and
 * where the pages are), copy threads pinned to the node's allowed CPUs, the
 * arena's new segments bound, and none of it with GPUCR_NUMA=0, one node, or a
 * GPU of unknown node. The real kernel does the binding: node 0 always exists. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "arena.h"
#include "numa.h"

#define LEN (4u << 20)

static char tree[] = "/tmp/gpucr-numa-test-XXXXXX";
static const char *gpu = "00000000:3B:00.0"; /* as the driver spells it */

static int fake_busid(char *busid, size_t len)
{
    if (!gpu)
        return -1;
    snprintf(busid, len, "%s", gpu);
    return 0;
}

static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tree, rel);
    for (char *s = path + strlen(tree) + 1; (s = strchr(s, '/')); s++) {
        *s = '\0';
        mkdir(path, 0700);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs(text, f);
    fclose(f);
}

/* A fresh shared /dev/shm mapping, as the arena makes them. */
static char *shm_map(void)
{
    char path[] = "/dev/shm/gpucr-numa-test-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    CHECK(ftruncate(fd, LEN) == 0);
    char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(p != MAP_FAILED);
    return p;
}

/* The policy of the range at p: its mode, and its node mask's first word. */
static int policy(void *p, unsigned long *mask0)
{
    int mode = -1;
    unsigned long mask[16] = {0};
    CHECK(syscall(SYS_get_mempolicy, &mode, mask, sizeof mask * 8, p, MPOL_F_ADDR) == 0);
    *mask0 = mask[0];
    return mode;
}

static int page_node(void *p)
{
    int n = -1;
    CHECK(syscall(SYS_get_mempolicy, &n, NULL, 0, p, MPOL_F_NODE | MPOL_F_ADDR) == 0);
    return n;
}

static void *pin_and_report(void *arg)
{
    gpucr_numa_pin_thread();
    CHECK(sched_getaffinity(0, sizeof(cpu_set_t), arg) == 0);
    return NULL;
}

/* The CPUs a new thread has after gpucr_numa_pin_thread(). */
static cpu_set_t pinned_cpus(void)
{
    cpu_set_t set;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, pin_and_report, &set) == 0);
    pthread_join(t, NULL);
    return set;
}

static void test_cpulist(void)
{
    cpu_set_t s;
    CHECK(gpucr_numa_parse_cpulist("0-3,8-11\n", &s) == 8);
    CHECK(CPU_ISSET(0, &s) && CPU_ISSET(3, &s) && !CPU_ISSET(4, &s) && !CPU_ISSET(7, &s));
    CHECK(CPU_ISSET(8, &s) && CPU_ISSET(11, &s) && !CPU_ISSET(12, &s));
    CHECK(gpucr_numa_parse_cpulist("5", &s) == 1 && CPU_ISSET(5, &s));
    CHECK(gpucr_numa_parse_cpulist("1,3,5-6", &s) == 4 && CPU_ISSET(6, &s) && !CPU_ISSET(4, &s));
    CHECK(gpucr_numa_parse_cpulist("", &s) == 0); /* a memory-only node */
    CHECK(gpucr_numa_parse_cpulist("0-3,x", &s) == -1);
    CHECK(gpucr_numa_parse_cpulist("3-1", &s) == -1);
    CHECK(gpucr_numa_parse_cpulist("2-", &s) == -1);
    PASS("numa cpulist");
}

static void test_sysfs(void)
{
    cpu_set_t s;
    CHECK(gpucr_numa_pci_node(tree, "0000:3b:00.0") == 0);
    CHECK(gpucr_numa_pci_node(tree, "00000000:3B:00.0") == 0);
    CHECK(gpucr_numa_pci_node(tree, "0000:AF:00.0") == 1);
    CHECK(gpucr_numa_pci_node(tree, "0000:05:00.0") == -1); /* sysfs says -1 */
    CHECK(gpucr_numa_pci_node(tree, "0000:06:00.0") == -1); /* no such device */
    CHECK(gpucr_numa_pci_node(tree, "not a bus id") == -1);
    CHECK(gpucr_numa_node_cpus(tree, 1, &s) == 8 && CPU_ISSET(1004, &s) && CPU_ISSET(1000, &s) && !CPU_ISSET(0, &s));
    CHECK(gpucr_numa_node_cpus(tree, 7, &s) == -1);
    PASS("numa sysfs");
}

static void test_bind_to_node0(void)
{
    unsigned long m;
    char *p = shm_map();
    CHECK(policy(p, &m) == MPOL_DEFAULT);
    CHECK(gpucr_numa_bind_to(p, LEN, 0) == 0);
    CHECK(policy(p, &m) == MPOL_PREFERRED && m == 1);
    memset(p, 1, LEN);
    CHECK(page_node(p) == 0 && page_node(p + LEN - 1) == 0);
    munmap(p, LEN);
    CHECK(gpucr_numa_bind_to(p, LEN, -1) == -1 && errno == EINVAL);
    PASS("numa bind to node 0");
}

static void test_placement(const cpu_set_t *allowed, int first)
{
    unsigned long m;
    gpu = "00000000:3B:00.0";
    gpucr_numa_reset(tree);
    CHECK(gpucr_numa_node_known() == -1); /* nothing asked yet */
    CHECK(gpucr_numa_node() == 0 && gpucr_numa_node_known() == 0);
    char *p = shm_map();
    gpucr_numa_bind(p, LEN);
    CHECK(policy(p, &m) == MPOL_PREFERRED && m == 1);
    memset(p, 1, LEN);
    CHECK(page_node(p) == 0);
    munmap(p, LEN);
    CHECK(*gpucr_numa_error() == '\0');
    cpu_set_t got = pinned_cpus(), want;
    CPU_ZERO(&want);
    CPU_SET(first, &want);
    CHECK(CPU_EQUAL(&got, &want)); /* node 0's CPUs here: the first allowed one */

    /* the arena's new segments are bound before they are pre-faulted */
    void *out[1];
    size_t size = 1 << 20;
    CHECK(gpucr_arena_configure(NULL) == 0);
    CHECK(gpucr_arena_place(&size, 1, out, NULL, NULL) == 0);
    CHECK(policy(out[0], &m) == MPOL_PREFERRED && m == 1 && page_node(out[0]) == 0);
    gpucr_arena_destroy(NULL);

    /* a GPU on node 1: none of its CPUs are allowed, the thread stays; binding
     * to a node this machine lacks fails, is noted, and changes nothing */
    gpu = "0000:af:00.0";
    gpucr_numa_reset(tree);
    CHECK(gpucr_numa_node() == 1);
    got = pinned_cpus();
    CHECK(CPU_EQUAL(&got, allowed));
    p = shm_map();
    gpucr_numa_bind(p, LEN);
    CHECK(strstr(gpucr_numa_error(), "node 1") != NULL);
    munmap(p, LEN);
    PASS("numa placement");
}

/* No GPU to name yet, a GPU of unknown node, one node, GPUCR_NUMA=0: nothing bound or pinned. */
static void test_nothing(const cpu_set_t *allowed)
{
    unsigned long m;
    struct { const char *gpu, *numa; int one_node; } cases[] = {
        {NULL, NULL, 0}, {"0000:05:00.0", NULL, 0}, {"0000:3b:00.0", NULL, 1}, {"0000:3b:00.0", "0", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gpu = cases[i].gpu;
        if (cases[i].numa)
            setenv("GPUCR_NUMA", cases[i].numa, 1);
        else
            unsetenv("GPUCR_NUMA");
        put("devices/system/node/online", cases[i].one_node ? "0\n" : "0-1\n");
        gpucr_numa_reset(tree);
        CHECK(gpucr_numa_node() == -1 && gpucr_numa_node_known() == -1);
        char *p = shm_map();
        gpucr_numa_bind(p, LEN);
        CHECK(policy(p, &m) == MPOL_DEFAULT);
        munmap(p, LEN);
        cpu_set_t got = pinned_cpus();
        CHECK(CPU_EQUAL(&got, allowed));
        CHECK(*gpucr_numa_error() == '\0');
    }
    unsetenv("GPUCR_NUMA");
    put("devices/system/node/online", "0-1\n");
    /* the same tree placed again once the variable is gone: the cases above were no accident */
    gpu = "0000:3b:00.0";
    gpucr_numa_reset(tree);
    CHECK(gpucr_numa_node() == 0);
    PASS("numa off, unknown, one node");
}

int main(void)
{
    cpu_set_t allowed;
    CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
    int first = 0;
    while (!CPU_ISSET(first, &allowed))
        first++;
    char cpus[16];
    snprintf(cpus, sizeof cpus, "%d\n", first);
    CHECK(mkdtemp(tree));
    put("devices/system/node/online", "0-1\n");
    put("devices/system/node/node0/cpulist", cpus);
    put("devices/system/node/node1/cpulist", "1000-1003,1004-1007\n");
    put("bus/pci/devices/0000:3b:00.0/numa_node", "0\n");
    put("bus/pci/devices/0000:af:00.0/numa_node", "1\n");
    put("bus/pci/devices/0000:05:00.0/numa_node", "-1\n");
    unsetenv("GPUCR_NUMA");
    gpucr_numa_gpu_busid = fake_busid;

    test_cpulist();
    test_sysfs();
    test_bind_to_node0();
    test_placement(&allowed, first);
    test_nothing(&allowed);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tree);
    CHECK(system(cmd) == 0);
    return 0;
}
