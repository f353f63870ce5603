"""Does the job fit what it will run on? Checked before the queue, not after it.

A spec can be well-formed and still impossible: more samples per step than the training split
holds, more nodes than the partition has, more CPUs, memory or GPUs per node than any node of it.
Slurm refuses some of these only when the job would start (or keeps it pending for ever, reason
"PartitionNodeLimit"), and the trainer finds the first one after the queue wait. `validate` and
`submit` ask here first.

`capacity_problems` is pure: the spec and the facts (`Facts`) in, Problems out. `gather_facts`
is the I/O around it: the split's manifest.json where this machine sees it, and sinfo where
Slurm answers (bounded; what could not be asked is a note, never an error).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hpc_train import scheduler
from hpc_train.data.manifest import token_windows
from hpc_train.rundir import parse_json
from hpc_train.scheduler.accounting import parse_memory
from hpc_train.scheduler.parse import NodeShape
from hpc_train.spec.problems import Problem, SpecInvalid
from hpc_train.spec.schema import JobSpec

SINFO_TIMEOUT = 10.0   # seconds: validate stays quick where slurmctld is slow or away


@dataclass(frozen=True)
class Facts:
    """What the job will meet: None where it is not known (not checked then)."""
    train_samples: int | None = None        # the training split's manifest
    manifest: str | None = None             # where that came from, for the message
    partition: str | None = None            # the partition the nodes are of ("debug")
    nodes: tuple[NodeShape, ...] | None = None   # of the job's partition; () when there is none
    partitions: tuple[str, ...] = ()             # every partition sinfo lists
    notes: tuple[str, ...] = field(default=())   # what could not be checked, and why


def capacity_problems(spec: JobSpec, facts: Facts) -> list[Problem]:
    """The node problems, else the samples one (which a wrong node count would only echo)."""
    return list(_node_problems(spec, facts)) or list(_samples_problems(spec, facts))


def _samples_problems(spec: JobSpec, facts: Facts) -> Iterator[Problem]:
    if facts.train_samples is None or spec.samples_per_step <= facts.train_samples:
        return
    per_rank = facts.train_samples // (spec.replicas * spec.parallel.accumulation)
    fix = (f"at most {per_rank:,} per rank with this layout; per-rank batches of 32-256 are usual"
           if per_rank else "fewer replicas or less accumulation: the split has fewer samples than "
           "one sample per rank per step needs")
    yield Problem("data.batch_size", f"{spec.data.batch_size:,}",
                  f"one step takes data.batch_size x {spec.replicas} replicas x "
                  f"{spec.parallel.accumulation} accumulation = {spec.samples_per_step:,} samples, more "
                  f"than the {facts.train_samples:,} of the training split ({facts.manifest})", fix)


def _node_problems(spec: JobSpec, facts: Facts) -> Iterator[Problem]:
    if facts.nodes is None:
        return
    where = f"partition {facts.partition}" if facts.partition else "the default partition"
    if not facts.nodes:
        names = ", ".join(facts.partitions) or "none"
        yield Problem("slurm.partition", repr(facts.partition), f"Slurm has no such partition "
                      f"(partitions: {names})" if facts.partition else "Slurm has no default partition",
                      "name one of the partitions sinfo lists")
        return
    slurm = spec.slurm
    cpus = slurm.tasks_per_node * slurm.cpus_per_task
    memory = _memory_mb(slurm.mem)
    wants = {   # per node: (key, value shown, what the largest node has, does a node fit)
        "cpus": ("slurm.tasks_per_node + slurm.cpus_per_task",
                 f"{slurm.tasks_per_node} x {slurm.cpus_per_task} = {cpus} CPUs",
                 max(n.cpus for n in facts.nodes), lambda n: n.cpus >= cpus, "CPUs"),
        "memory": ("slurm.mem", slurm.mem, max(n.memory_mb for n in facts.nodes),
                   lambda n: memory is None or n.memory_mb >= memory, "MB of memory"),
        "gpus": ("slurm.gpus_per_node", slurm.gpus_per_node, max(n.gpus for n in facts.nodes),
                 lambda n: n.gpus >= slurm.gpus_per_node, "GPUs"),
    }
    for key, shown, largest, fits, unit in wants.values():
        if not any(fits(n) for n in facts.nodes):
            yield Problem(key, str(shown), f"no node of {where} has that many: the largest has "
                          f"{largest:,} {unit}", f"ask for at most {largest:,} {unit} per node, or "
                          "choose another partition with slurm.partition")
            return
    fitting = sum(all(fits(n) for _, _, _, fits, _ in wants.values()) for n in facts.nodes)
    needed = slurm.nodes + slurm.spare_nodes
    if needed > fitting:
        spares = f" + {slurm.spare_nodes} spare" if slurm.spare_nodes else ""
        yield Problem("slurm.nodes", f"{slurm.nodes:,}{spares}",
                      f"{where} has {fitting:,} node(s) that fit the per-node request "
                      f"(of {len(facts.nodes):,})", f"ask for at most {fitting:,} node(s), "
                      "or choose a larger partition with slurm.partition")


def _memory_mb(mem: str | None) -> int | None:
    """slurm.mem in MB; None for no request or "0" (all of the node's memory)."""
    if not mem:
        return None
    value = parse_memory(str(mem), bare="M")
    return None if not value else value // 2**20


@dataclass(frozen=True)
class SlurmFacts:
    """What sinfo said of every partition's nodes (None: not asked, or no answer: `notes`)."""
    nodes: tuple[NodeShape, ...] | None = None
    notes: tuple[str, ...] = ()


def ask_slurm_nodes(ask_slurm: bool = True) -> SlurmFacts:
    """Every node sinfo lists, when `ask_slurm` and Slurm answers within SINFO_TIMEOUT (asked
    once for a workflow's many specs)."""
    if not ask_slurm:
        return SlurmFacts()
    # sinfo waits for a controller that does not answer (9 s here) or retries a missing
    # configuration for a minute; scontrol ping says so at once.
    if down := scheduler.controller_problem(timeout=SINFO_TIMEOUT):
        return SlurmFacts(None, (f"nodes and per-node resources not checked against Slurm: {down}",))
    found, why = scheduler.node_shapes(timeout=SINFO_TIMEOUT)
    if why or not found:
        return SlurmFacts(None, ("nodes and per-node resources not checked against Slurm: "
                                 f"{why or 'sinfo lists no nodes'}",))
    return SlurmFacts(tuple(found))


def gather_facts(spec: JobSpec, slurm: SlurmFacts) -> Facts:
    """The facts this machine can see: the manifest (when data.path is visible here) and, of
    what sinfo said (`ask_slurm_nodes`), the nodes of the spec's partition."""
    samples, manifest = _train_samples(spec)
    nodes, partitions = None, ()
    if slurm.nodes is not None:
        chosen = spec.slurm.partition
        nodes = tuple(n for n in slurm.nodes if (n.partition == chosen if chosen else n.default))
        partitions = tuple(dict.fromkeys(n.partition for n in slurm.nodes))
    return Facts(samples, manifest, spec.slurm.partition, nodes, partitions, slurm.notes)


def _train_samples(spec: JobSpec) -> tuple[int | None, str | None]:
    """Samples in the training split's manifest (images; for text, windows of seq_len + 1)."""
    if spec.data.kind not in ("hdf5", "tokens") or not spec.data.path:
        return None, None
    path = Path(spec.data.path) / "train" / "manifest.json"
    try:
        manifest = parse_json(path.read_text())
    except (OSError, ValueError):
        return None, None      # not visible here: the submission warns about that already
    if isinstance(manifest.get("num_samples"), int):
        return manifest["num_samples"], str(path)
    if manifest.get("kind") == "tokens":
        try:
            return sum(token_windows(manifest, spec.data.seq_len)), str(path)
        except (KeyError, TypeError, ValueError):
            return None, None     # a damaged manifest: the data check at start names it
    return None, None


def check_capacity(spec: JobSpec, ask_slurm: bool = True) -> tuple[str, ...]:
    """Raise SpecInvalid (exit 2, one line each) when the job cannot fit; else the notes on
    what could not be checked."""
    facts = gather_facts(spec, ask_slurm_nodes(ask_slurm))
    problems = capacity_problems(spec, facts)
    if problems:
        raise SpecInvalid(problems)
    return facts.notes
