#!/bin/sh
# On the GPU machine: build pinprobe, run it with a hugetlbfs arena and with a
# /dev/shm arena (16 GiB arena, 8 GiB of device memory). JSON to $OUT.
set -u
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/probe-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader >"$OUT/env.txt"
gcc -O2 -I/usr/local/cuda/include -o /tmp/pinprobe pinprobe.c -lcuda -lpthread || exit 1
echo 8300 >/proc/sys/vm/nr_hugepages
mkdir -p /dev/gpucr-huge && mount -t hugetlbfs nodev /dev/gpucr-huge
grep -E 'HugePages_(Total|Free)' /proc/meminfo | tr -s ' ' | tr '\n' ' ' >>"$OUT/env.txt"
timeout 200 python3 pinprobe.py /tmp/pinprobe /dev/gpucr-huge 16 8 >"$OUT/probe-huge.json" 2>"$OUT/probe-huge.log"
echo "huge rc=$?"
umount /dev/gpucr-huge; echo 0 >/proc/sys/vm/nr_hugepages
timeout 200 python3 pinprobe.py /tmp/pinprobe /dev/shm 16 8 >"$OUT/probe-shm.json" 2>"$OUT/probe-shm.log"
echo "shm rc=$?"
cat "$OUT/env.txt"; echo
cut -c1-200 "$OUT/probe-huge.log" "$OUT/probe-shm.log"
