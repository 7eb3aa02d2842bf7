/* numa.c: the arena and the copy threads on the GPU's NUMA node. */
#ifndef GPUCR_NUMA_H
#define GPUCR_NUMA_H

#include <sched.h>
#include <stddef.h>

/* Set by the CUDA side (numa_gpu.c, through init.c): the PCI bus id of the
 * calling thread's GPU ("0000:3b:00.0"); 0, or -1 while there is none to name
 * (no context yet). */
extern int (*gpucr_numa_gpu_busid)(char *busid, size_t len);
/* The GPU's node, settled once a GPU can be named; -1 when off (GPUCR_NUMA=0),
 * unknown, or the machine has one node. _known never asks the driver. */
int gpucr_numa_node(void);
int gpucr_numa_node_known(void);
void gpucr_numa_bind(void *p, size_t len); /* before first touch; MPOL_PREFERRED */
void gpucr_numa_pin_thread(void); /* onto the node's CPUs the thread may use */
const char *gpucr_numa_error(void); /* the last placement failure, "" when none */
/* Forget the node (the process may be on another machine now); sysfs: the root
 * to read instead of /sys (tests), NULL to keep it. */
void gpucr_numa_reset(const char *sysfs);
void gpucr_numa_after_fork_child(void);
/* The parts, for tests: a cpulist ("0-3,8-11"): CPUs set, -1 when malformed;
 * a PCI device's node (-1 unknown); a node's CPUs; mbind to node n (0, -1 errno). */
int gpucr_numa_parse_cpulist(const char *list, cpu_set_t *set);
int gpucr_numa_pci_node(const char *sysfs, const char *busid);
int gpucr_numa_node_cpus(const char *sysfs, int node, cpu_set_t *set);
int gpucr_numa_bind_to(void *p, size_t len, int node);

#endif
