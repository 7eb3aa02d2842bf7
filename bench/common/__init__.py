"""What the benchmarks (bench/) and the GPU checks (gpu-checks/) share: the JSON
record a run writes (`record`), the machine it ran on (`machine`, and its raw
pinned copy rate: `pinned`), medians (`stats`), waits with a deadline
(`timing`), timed `gpucr-hpc` commands (`gpucr_cli`) and the optional plots
beside a record (`plots`).

The programs run from a checkout, not installed: those in bench/ find this
package beside them, those in gpu-checks/ put bench/ on sys.path first."""
