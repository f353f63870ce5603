"""Cross-field rules: pure functions of a JobSpec that yield Problems (rule, values, fix).

They run at submit time on the login node, so a job that would hang, waste GPUs or die before
its checkpoint is refused before anything is queued. ERROR_RULES stop the job; WARNING_RULES
are printed and the job goes on: the list a rule is in, not the rule, sets the severity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields, replace

from hpc_train import usercode
from hpc_train.launch.network import MPI_INTERFACE_VARS, RANK_INTERFACE_VARS
from hpc_train.spec.compression_rules import COMPRESSION_ERROR_RULES
from hpc_train.spec.fsdp_rules import FSDP_ERROR_RULES, FSDP_WARNING_RULES
from hpc_train.spec.deepspeed_rules import DEEPSPEED_ERROR_RULES
from hpc_train.spec.node_range import NODE_RANGE_ERROR_RULES
from hpc_train.spec.pipeline_rules import PIPELINE_ERROR_RULES, PIPELINE_WARNING_RULES
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import JobSpec
from hpc_train.spec.task_rules import TASK_ERROR_RULES
from hpc_train.spec.throughput_rules import THROUGHPUT_ERROR_RULES, THROUGHPUT_WARNING_RULES
from hpc_train.spec.tracker_rules import TRACKER_WARNING_RULES

Rule = Callable[[JobSpec], Iterable[Problem]]

# Slurm's time-limit check runs about every 30 s, so a signal closer than that to the limit may
# arrive after the job is already killed.
SLURM_KILL_SLACK_S = 30


def hdf5_needs_path(spec: JobSpec) -> Iterator[Problem]:
    if spec.data.kind in ("hdf5", "tokens") and spec.data.path is None:
        yield Problem("data.path", f"null with data.kind {spec.data.kind!r}",
                      "HDF5 data needs the directory of its shards",
                      "set data.path: /path/to/shards, or data.kind: "
                      + ("synthetic" if spec.data.kind == "hdf5" else "text"))


def signal_before_limit(spec: JobSpec) -> Iterator[Problem]:
    latest = spec.time_seconds - SLURM_KILL_SLACK_S
    if spec.slurm.signal_seconds >= latest:
        yield Problem("slurm.signal_seconds",
                      f"{spec.slurm.signal_seconds} with slurm.time {spec.slurm.time!r} "
                      f"({spec.time_seconds} s)",
                      f"the stop signal must come before the limit minus {SLURM_KILL_SLACK_S} s "
                      f"(Slurm checks limits about every {SLURM_KILL_SLACK_S} s), so < {latest}",
                      f"lower slurm.signal_seconds below {max(latest, 1)} or raise slurm.time")


def keep_every_needs_period(spec: JobSpec) -> Iterator[Problem]:
    ckpt = spec.checkpoint
    if ckpt.keep_every is not None and ckpt.every_steps is None and ckpt.every_minutes is None:
        yield Problem("checkpoint.keep_every",
                      f"{ckpt.keep_every} with every_steps and every_minutes both null",
                      "nothing to keep: no periodic checkpoints are saved",
                      "set checkpoint.every_steps or checkpoint.every_minutes")


def one_rank_per_gpu(spec: JobSpec) -> Iterator[Problem]:
    slurm = spec.slurm
    if slurm.gpus_per_node > 0 and slurm.tasks_per_node > slurm.gpus_per_node:
        yield Problem("slurm.tasks_per_node",
                      f"{slurm.tasks_per_node} with slurm.gpus_per_node {slurm.gpus_per_node}",
                      "each rank drives one GPU, so there cannot be more ranks than GPUs",
                      f"set slurm.tasks_per_node: {slurm.gpus_per_node}")


def idle_gpus(spec: JobSpec) -> Iterator[Problem]:
    slurm = spec.slurm
    if slurm.tasks_per_node < slurm.gpus_per_node:
        yield Problem("slurm.tasks_per_node",
                      f"{slurm.tasks_per_node} with slurm.gpus_per_node {slurm.gpus_per_node}",
                      f"{slurm.gpus_per_node - slurm.tasks_per_node} GPU(s) per node stay idle",
                      f"set slurm.tasks_per_node: {slurm.gpus_per_node}")


def fixed_loss_scale_unused(spec: JobSpec) -> Iterator[Problem]:
    if spec.precision.loss_scale != "dynamic" and spec.precision.mode != "fp16":
        yield Problem("precision.loss_scale",
                      f"{spec.precision.loss_scale} with precision.mode {spec.precision.mode!r}",
                      "loss scaling only applies to fp16 and is ignored",
                      "remove precision.loss_scale, or set precision.mode: fp16")


def warmup_shorter_than_training(spec: JobSpec) -> Iterator[Problem]:
    optim = spec.optim
    if optim.warmup_epochs > 0 and optim.warmup_epochs >= optim.epochs:
        yield Problem("optim.warmup_epochs", f"{optim.warmup_epochs:g} with optim.epochs "
                      f"{optim.epochs}", "the warm-up never ends, so the LR never reaches "
                      "the scaled LR", f"set optim.warmup_epochs below {optim.epochs}")


def milestones_within_training(spec: JobSpec) -> Iterator[Problem]:
    optim = spec.optim
    late = [m for m in optim.step_milestones if m >= optim.epochs]
    if optim.schedule == "step" and late:
        yield Problem("optim.step_milestones", f"{late} with optim.epochs {optim.epochs}",
                      "milestones at or after the last epoch never apply",
                      "drop them or raise optim.epochs")


def path_unused(spec: JobSpec) -> Iterator[Problem]:
    if spec.data.kind == "dataset" and spec.data.path is not None:
        yield Problem("data.path", f"{spec.data.path!r} with data.kind 'dataset'",
                      "data.path is the directory of our shards; your dataset is not given it",
                      "pass your dataset's paths in data.options (its keyword arguments), e.g. "
                      "data.options.root: /path/to/images, and remove data.path")
    elif spec.data.kind in ("synthetic", "text") and spec.data.path is not None:
        yield Problem("data.path", f"{spec.data.path!r} with data.kind {spec.data.kind!r}",
                      "generated data reads no files, so the path is ignored",
                      "set data.kind: hdf5 (or tokens) to read it, or remove data.path")


def copy_to_unused(spec: JobSpec) -> Iterator[Problem]:
    if spec.data.copy_to is not None and spec.data.kind in ("synthetic", "text", "dataset"):
        yield Problem("data.copy_to", f"{spec.data.copy_to!r} with data.kind {spec.data.kind!r}",
                      "only our shards are copied to a node-local directory",
                      "remove data.copy_to (copy your dataset's files in slurm.setup if needed)")


def dataset_named(spec: JobSpec) -> Iterator[Problem]:
    """data.kind dataset and data.dataset go together."""
    data = spec.data
    if data.kind == "dataset" and data.dataset is None:
        yield Problem("data.dataset", "null with data.kind 'dataset'",
                      "the dataset kind reads your own dataset, named by reference",
                      "set data.dataset: package.module:callable, e.g. my_lab.data:images")
    elif data.kind != "dataset" and (data.dataset is not None or data.options):
        key = "data.dataset" if data.dataset is not None else "data.options"
        yield Problem(key, f"set with data.kind {data.kind!r}",
                      "your dataset is only read with data.kind dataset",
                      "set data.kind: dataset, or remove " + key)


def optimizer_options_unused(spec: JobSpec) -> Iterator[Problem]:
    if spec.optim.options and not usercode.looks_like_reference(spec.optim.name):
        yield Problem("optim.options", f"{sorted(spec.optim.options)} with optim.name "
                      f"{spec.optim.name!r}", "optim.options are the keyword arguments of an "
                      "optimizer named by reference; ours take optim.momentum, weight_decay, ...",
                      "use those keys, or name the optimizer by reference, e.g. "
                      "optim.name: torch.optim:RAdam")


def copy_to_on_the_node(spec: JobSpec) -> Iterator[Problem]:
    place = spec.data.copy_to
    if place is not None and not place.startswith(("/", "$")):
        yield Problem("data.copy_to", repr(place),
                      "a node-local directory is an absolute path, or starts with a variable "
                      "the node sets", "write e.g. data.copy_to: $SLURM_TMPDIR or /local/scratch")


def one_network_setting(spec: JobSpec) -> Iterator[Problem]:
    """launch.network_interface owns the interface variables of every layer: a second value for
    one of them in launch.env would make two layers use different networks."""
    if spec.launch.network_interface is None:
        return
    owned = set(RANK_INTERFACE_VARS) | set(MPI_INTERFACE_VARS)
    for name in sorted(owned & set(spec.launch.env)):
        yield Problem(f"launch.env.{name}", repr(spec.launch.env[name]),
                      f"launch.network_interface ({spec.launch.network_interface!r}) sets {name} "
                      "and the interface of every other layer",
                      f"remove launch.env.{name}, or remove launch.network_interface")


# The parallel sections that tune one choice each: (section, the parallel key that makes the
# choice, the value that chooses it).
SECTION_CHOICES = (("fsdp", "backend", "fsdp"), ("deepspeed", "backend", "deepspeed"),
                   ("powersgd", "compression", "powersgd"))


def section_settings_unused(spec: JobSpec) -> Iterator[Problem]:
    """A section's settings in a job that does not choose what they tune (a sharded backend's
    under another backend, PowerSGD's without it): ignored, so said."""
    for section, key, value in SECTION_CHOICES:
        settings, chosen = getattr(spec.parallel, section), getattr(spec.parallel, key)
        defaults = type(settings)()
        changed = [f.name for f in fields(settings) if getattr(settings, f.name) != getattr(defaults, f.name)]
        if changed and chosen != value:
            yield Problem(f"parallel.{section}", f"{', '.join(changed)} with parallel.{key} "
                          f"{chosen!r}", f"these settings only tune {value}; they are ignored",
                          f"set parallel.{key}: {value}, or remove the parallel.{section} keys")


def pmi_needs_srun(spec: JobSpec) -> Iterator[Problem]:
    if spec.launch.method == "mpirun" and spec.launch.pmi != "pmix":
        yield Problem("launch.pmi", f"{spec.launch.pmi!r} with launch.method 'mpirun'",
                      "launch.pmi is srun's --mpi plugin; mpirun does not use it",
                      "set launch.method: srun, or remove launch.pmi")
    if spec.launch.method == "srun" and spec.launch.pmi == "pmi2" and spec.launch.mpi == "openmpi":
        yield Problem("launch.pmi", "'pmi2' with launch.mpi 'openmpi'",
                      "Open MPI as most distributions build it has no Slurm PMI-2 client; its "
                      "ranks then start as separate one-rank worlds",
                      "set launch.pmi: pmix (check `srun --mpi=list` on the cluster)")


ERROR_RULES: tuple[Rule, ...] = (hdf5_needs_path, signal_before_limit, keep_every_needs_period,
                                 one_rank_per_gpu, one_network_setting, copy_to_on_the_node,
                                 dataset_named, optimizer_options_unused,
                                 *PIPELINE_ERROR_RULES, *THROUGHPUT_ERROR_RULES,
                                 *NODE_RANGE_ERROR_RULES, *FSDP_ERROR_RULES,
                                 *DEEPSPEED_ERROR_RULES, *COMPRESSION_ERROR_RULES,
                                 *TASK_ERROR_RULES)
WARNING_RULES: tuple[Rule, ...] = (idle_gpus, fixed_loss_scale_unused,
                                   warmup_shorter_than_training, milestones_within_training,
                                   path_unused, pmi_needs_srun, copy_to_unused,
                                   *PIPELINE_WARNING_RULES, *THROUGHPUT_WARNING_RULES,
                                   *FSDP_WARNING_RULES, section_settings_unused,
                                   *TRACKER_WARNING_RULES)


def check_spec(spec: JobSpec) -> tuple[list[Problem], list[Problem]]:
    """(errors, warnings) from every cross-field rule."""
    errors = [p for rule in ERROR_RULES for p in rule(spec)]
    warnings = [replace(p, severity="warning") for rule in WARNING_RULES for p in rule(spec)]
    return errors, warnings
