"""`gpucr-hpc doctor`: what this node (or every node of a partition) lacks."""

from __future__ import annotations

import click

from gpucr_hpc.cli import output
from gpucr_hpc.doctor import checks, nodes
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.slurm.site import node_name


def print_report(reports: list[dict]) -> None:
    """The --json answer: one document for all nodes, failures included (the exit status
    and the one line on stderr say that some failed)."""
    output.print_json("doctor", {"nodes": reports})


def _line(node: str, c: dict) -> str:
    word = {True: "ok", False: "FAIL", None: "skip"}[c["ok"]]
    fix = f"; {c['fix']}" if c["ok"] is False and c["fix"] else ""
    return f"{node}: {word:4} {c['name']}: {c['detail']}{fix}"


@click.command()
@click.option("--partition", "-p", metavar="NAME",
              help="Check every responding node of this partition, through Slurm (one task per node).")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON document: {"schema": "gpucr-hpc.doctor/1", "nodes": [{"node", "checks"}]}.')
def doctor(partition, as_json):
    """Check what gpucr-hpc needs: CRIU (and a real dump and restore), nft and
    CRIU's image module, the plugin's plugstack line, the shim and `cli=` as an
    ordinary user reaches them, the root helper and its sudo rule, the node key,
    the image root, the arena, the GPU (driver, cuda-python), what multi-node
    jobs need (srun --mpi=pmix, mpi4py), the preemption settings (PreemptMode,
    GraceTime). One line per check (skip: not checked here, with the reason);
    exits 1 on any FAIL."""
    if partition:
        reports = nodes.run_on_partition(partition)
        mismatch = nodes.key_mismatch(reports)
        if mismatch:
            reports[0]["checks"].append(mismatch.as_dict())
    else:
        reports = [{"node": node_name(), "checks": [c.as_dict() for c in checks.run_all()]}]
    if as_json:
        print_report(reports)
    else:
        for r in reports:
            for c in r["checks"]:
                click.echo(_line(r["node"], c))
    failed = [(r["node"], c) for r in reports for c in r["checks"] if c["ok"] is False]
    if failed:
        on = sorted({node for node, _ in failed})
        what = 'the checks with "ok": false' if as_json else "the FAIL lines"
        raise GpucrError(f"{len(failed)} check(s) failed on {', '.join(on)}",
                         f"fix what {what} say, then run gpucr-hpc doctor again")
