"""Compare the probe reports of `doctor --allocation` (pure functions, unit-tested).

Every node must have what the majority has (versions, Horovod's build, GPUs): a job whose ranks
import different code fails in ways that point nowhere near the cause. Ties (two nodes, two
answers) go to the first node, where rank 0 and the batch script run, so the other node is the
one named; the message gives both values either way. Each rank must reach MASTER_ADDR and get
the right allreduce; a rank that wrote no report is named with the node it was meant to run on.

The result is a plain dict (what `--json` prints), so `doctor --nodes` renders the report that a
job printed exactly as `doctor --allocation` renders its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpc_train.doctor.node_probe import PACKAGES

FACTS = ("python", *PACKAGES, "horovod build", "GPUs")


@dataclass(frozen=True)
class LaunchResult:
    """How the launcher (mpirun or srun) of the probes ended."""
    argv: Sequence[str]
    returncode: int          # 124: the doctor's timeout ended it
    seconds: float
    output_tail: str = ""


def horovod_build(build: Mapping) -> str:
    """{'mpi_built': True, 'gloo_built': True, 'nccl_built': False} -> 'MPI+Gloo'."""
    if "error" in build:
        return f"error: {build['error']}"
    ops = [label for key, label in (("mpi_built", "MPI"), ("gloo_built", "Gloo"), ("nccl_built", "NCCL"))
           if build.get(key)]
    return "+".join(ops) or "no controller"


def node_facts(report: Mapping) -> dict[str, str]:
    """What must agree between nodes, as strings, from one rank's report."""
    facts = {"python": str(report.get("python", "?"))}
    versions = report.get("versions", {})
    facts.update({name: str(versions.get(name, "?")) for name in PACKAGES})
    facts["horovod build"] = horovod_build(report.get("horovod_build", {}))
    gpus = report.get("gpus")
    facts["GPUs"] = str(gpus) if gpus is not None else f"error: {report.get('gpu_error', '?')}"
    return facts


def majority(values: Sequence[str]) -> str:
    """The most common value; a tie goes to the one seen first (the first node's)."""
    return Counter(values).most_common(1)[0][0]


def _problem(node: str, rank: int | None, what: str) -> dict:
    return {"node": node, "rank": rank, "what": what}


def rank_problems(rank: int, node: str, report: Mapping | None) -> list[dict]:
    if report is None:
        return [_problem(node, rank, "wrote no report: the rank did not start, or died before "
                                     "its checks (see the launcher's output)")]
    problems = []
    master = report.get("master", {})
    if not master.get("ok"):
        where = f" {master['addr']}:{master.get('port')}" if master.get("addr") else ""
        problems.append(_problem(node, rank, f"cannot reach MASTER_ADDR{where}: "
                                             f"{master.get('detail', 'no answer')}"))
    result = report.get("allreduce")
    if result is None:
        problems.append(_problem(node, rank, "did not finish the allreduce: MPI hung or failed "
                                             "(see the launcher's output)"))
    elif "error" in result:
        problems.append(_problem(node, rank, f"allreduce failed: {result['error']}"))
    elif not result.get("ok"):
        problems.append(_problem(node, rank, (
            f"allreduce wrong: got {result.get('got'):g} where {result.get('expected')} was due, in "
            f"{result.get('wrong_elements')} elements (MPI sees rank {result.get('mpi_rank')} of "
            f"{result.get('mpi_size')}; launched as rank {rank} of {report.get('size')})")))
    return problems


def disagreements(facts_by_node: Mapping[str, Mapping[str, str]]) -> tuple[dict[str, str], list[dict]]:
    """(the majority's value of each fact, one problem per node and fact that differs)."""
    nodes = list(facts_by_node)
    reference, problems = {}, []
    for fact in FACTS:
        values = {node: facts_by_node[node][fact] for node in nodes}
        reference[fact] = common = majority(list(values.values()))
        agreeing = [node for node, value in values.items() if value == common]
        for node, value in values.items():
            if value != common:
                problems.append(_problem(node, None, f"{fact} {value} differs from {common} on "
                                                     f"{', '.join(agreeing)}"))
    return reference, problems


def launch_problem(launch: LaunchResult) -> list[dict]:
    if launch.returncode == 0:
        return []
    program = launch.argv[0].rsplit("/", 1)[-1] if launch.argv else "launcher"
    how = (f"did not end within the timeout (stopped after {launch.seconds:.0f} s)"
           if launch.returncode == 124 else f"exited {launch.returncode}")
    tail = " | ".join(launch.output_tail.strip().splitlines()[-3:])
    return [_problem("", None, f"{program} {how}" + (f": {tail}" if tail else ""))]


def compare(placement: Sequence[str], reports: Mapping[int, Mapping], launch: LaunchResult | None = None) -> dict:
    """placement: the host each rank was meant to run on (rank order); reports: rank -> its
    report (absent: none written). Returns the report dict with `ok`, `verdict` and `problems`."""
    facts_by_node: dict[str, dict[str, str]] = {}
    nodes: dict[str, dict] = {}
    problems: list[dict] = []
    for rank, planned in enumerate(placement):
        report = reports.get(rank)
        node = report.get("host", planned) if report else planned
        entry = nodes.setdefault(node, {"node": node, "ranks": [], "master": [], "allreduce": []})
        entry["ranks"].append(rank)
        if report is not None:
            facts_by_node.setdefault(node, node_facts(report))
            entry["master"].append(bool(report.get("master", {}).get("ok")))
            result = report.get("allreduce") or {}
            entry["allreduce"].append(result.get("seconds_mean") if result.get("ok") else None)
        problems += rank_problems(rank, node, report)
    reference, differing = disagreements(facts_by_node) if facts_by_node else ({}, [])
    problems = differing + problems + (launch_problem(launch) if launch else [])
    for node, entry in nodes.items():
        entry["facts"] = facts_by_node.get(node, {})
        entry["differs"] = [fact for fact, value in entry["facts"].items() if value != reference[fact]]
    result = {"ok": not problems, "verdict": verdict(list(nodes), placement, reports, problems),
              "problems": problems, "majority": reference, "nodes": list(nodes.values()),
              "reports": {str(rank): reports[rank] for rank in sorted(reports)}}
    if launch is not None:
        result["launcher"] = {"argv": list(launch.argv), "returncode": launch.returncode,
                              "seconds": round(launch.seconds, 1), "output_tail": launch.output_tail}
    return result


def describe(problem: Mapping) -> str:
    if not problem["node"]:
        return problem["what"]
    who = problem["node"] + (f" rank {problem['rank']}" if problem["rank"] is not None else "")
    return f"{who}: {problem['what']}"


def verdict(nodes: Sequence[str], placement: Sequence[str], reports: Mapping[int, Mapping],
            problems: Sequence[Mapping]) -> str:
    """One line: OK with what was checked, or FAIL with the count and the first problem."""
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return f"FAIL: {len(problems)} problem{'s' * (len(problems) > 1)}: {describe(problems[0])}{more}"
    master = next(iter(reports.values()))["master"]
    slowest = max(r["allreduce"]["seconds_mean"] for r in reports.values())
    mib = next(iter(reports.values()))["allreduce"]["bytes"] / 2**20
    return (f"OK: {len(nodes)} node{'s' * (len(nodes) > 1)} agree ({', '.join(nodes)}); "
            f"{len(placement)} rank{'s' * (len(placement) > 1)} reach MASTER_ADDR "
            f"{master['addr']}:{master['port']}; {mib:g} MiB allreduce correct, {slowest * 1e3:.2f} ms")
