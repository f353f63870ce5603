"""The job spec as typed, frozen dataclasses: the one source of truth for keys, types and defaults.

The loader derives the valid keys from `dataclasses.fields`, converts values from the annotation,
and checks the limits kept in each field's metadata (see `spec_field`). Add a field here and it is
accepted, checked, dumped and hashed everywhere; nothing else lists the keys.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field
from enum import Enum
from typing import Any, Callable, Literal, Optional, Union

from hpc_train.models.catalog import MODEL_NAMES, model as model_entry, options_of
from hpc_train.parallel.layout import Parallelism, ParallelLayout
from hpc_train.runtime.heartbeat import AUTO, AUTO_START_SECONDS
from hpc_train.runtime.node_log import PER_NODE_ABOVE, RankLogs
from hpc_train.runtime.tracker_state import Tracker
from hpc_train.spec import values

ModelName = Literal[MODEL_NAMES]        # the model catalog's names: one list
TOKEN_KINDS = ("text", "tokens")        # data kinds of token sequences, for the gpt model
BYTE_VOCAB = 256                        # token values of byte tokens; data/tokens.py reads it here
DEFAULT_STALL_SECONDS = 300.0           # launch.stall_seconds; also for runs that did not record it
DEFAULT_INIT_SCALE = 2.0 ** 16          # precision.init_scale, as torch's GradScaler's


def spec_field(default: Any = MISSING, *, doc: str, factory: Callable[[], Any] | None = None,
               ge: float | None = None, gt: float | None = None, le: float | None = None,
               lt: float | None = None, check: Callable | None = None, each: Callable | None = None,
               key_check: Callable | None = None, example: Any = None,
               declared_by: Callable[[dict], type | None] | None = None) -> Any:
    """A dataclass field plus what the loader needs to check it.

    ge/gt/le/lt: numeric limits. check: `values.check_*` run on the converted value;
    each: run on every item of a list or value of a dict; key_check: on every dict key.
    example: shown in fixes when the default (None, say) is not a useful example.
    declared_by: for a mapping whose keys and types depend on another field of the section
    (model.options on model.name): given the section's values converted so far (defaults for
    keys not given), the dataclass that declares them; the mapping is then checked like a
    section.
    """
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "check": check, "each": each,
            "key_check": key_check, "example": example, "declared_by": declared_by}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RunSpec:
    name: str = spec_field(doc="run and Slurm job name; becomes the run directory name",
                           check=values.check_run_name, example="resnet50-imagenet")
    root: str = spec_field("runs", doc="directory under which run directories are made",
                           check=values.check_path)
    seed: int = spec_field(0, doc="base random seed; each rank derives its own", ge=0)
    code: list[str] = spec_field(
        doc="folders holding the packages your references (model.name, model.blocks, "
        "data.dataset, task.name, optim.name) name, besides the submit directory; the snapshot "
        "taken at submit copies those packages with ours", factory=list, each=values.check_path,
        example=["examples/user_cnn"])


@dataclass(frozen=True)
class Resources:
    """What one batch job asks Slurm for, and the shell it runs first: a workflow stage's
    `slurm:`; a job spec's adds the job's shape (SlurmSpec). Options: slurm/options.py."""
    partition: Optional[str] = spec_field(None, doc="partition; None = the site default",
                                          check=values.check_slurm_name, example="gpu")
    gpus_per_node: int = spec_field(0, doc="GPUs per node; 0 = a CPU job", ge=0)
    cpus_per_task: int = spec_field(1, doc="CPU cores per rank (data workers live here)", ge=1)
    mem: Optional[str] = spec_field(None, doc='memory per node: "16G", "4000M", "0" = all',
                                    check=values.check_memory, example='"16G"')
    time: str = spec_field("00:30:00", doc="time limit in a Slurm format (D-HH:MM:SS ...)",
                           check=values.check_slurm_time, example='"01:30:00"')
    account: Optional[str] = spec_field(None, doc="account to charge",
                                        check=values.check_slurm_name, example="myproject")
    qos: Optional[str] = spec_field(None, doc="quality of service", check=values.check_slurm_name,
                                    example="normal")
    constraint: Optional[str] = spec_field(None, doc="node features, e.g. a100&ib",
                                           check=values.check_slurm_name, example="a100")
    mail_type: Optional[str] = spec_field(
        None, doc="when Slurm mails: a comma list of BEGIN, END, FAIL, REQUEUE, TIME_LIMIT, ... "
        "(sbatch --mail-type)", check=values.check_mail_type, example="END,FAIL")
    mail_user: Optional[str] = spec_field(None, doc="who Slurm mails (sbatch --mail-user)",
                                          check=values.check_mail_user, example="me@example.org")
    extra: dict[str, str] = spec_field(
        doc='more sbatch options, name (no --) -> value; "" for a flag without value',
        factory=dict, key_check=values.check_sbatch_option, each=values.check_argument)
    # Shell by design: the user's own module loads and exports, run as written.
    setup: list[str] = spec_field(doc="shell lines run before the job's command (module load ...)",
                                  factory=list)
    site_profile: Optional[str] = spec_field(None, doc="site profile file, sourced before setup",
                                             check=values.check_path, example="env/site.sh")

    @property
    def time_minutes(self) -> int:
        """The limit as Slurm enforces it: whole minutes (Slurm rounds seconds up)."""
        seconds = values.parse_duration(self.time)
        if seconds is None:  # only reachable for a value built by hand, not loaded
            raise ValueError(f"slurm.time {self.time!r} is not a Slurm time")
        return math.ceil(seconds / 60)


@dataclass(frozen=True)
class SlurmSpec(Resources):
    """A job spec's `slurm:`: the resources, the job's shape and its stop signal."""
    nodes: int = spec_field(1, doc="number of nodes; Slurm's MIN-MAX (1-2) is a range: the job "
                            "starts on what Slurm gives within it and goes on with the nodes left "
                            "when one dies (sbatch --no-kill)", ge=1)
    min_nodes: Optional[int] = spec_field(
        None, doc="the fewest nodes the job may train on; None = exactly slurm.nodes. Written "
        "as the range slurm.nodes: MIN-MAX (spec/node_range.py)", ge=1, example=1)
    tasks_per_node: int = spec_field(1, doc="ranks per node (one per GPU on GPU jobs)", ge=1)
    spare_nodes: int = spec_field(
        0, doc="hot spares: nodes asked for beyond slurm.nodes and kept idle; when a node of the "
        "job dies the ranks start again inside the job on a spare (sbatch --no-kill keeps the "
        "allocation)", ge=0)
    # Slurm delivers the signal with up to a minute of slack; 65535 is Slurm's own maximum.
    signal_seconds: int = spec_field(120, doc="seconds before the limit that USR2 is sent",
                                     ge=1, le=65535)

    @property
    def fewest_nodes(self) -> int:
        """The fewest nodes the job trains on: min_nodes, or nodes without a range."""
        return self.nodes if self.min_nodes is None else self.min_nodes


@dataclass(frozen=True)
class LaunchSpec:
    method: Literal["mpirun", "srun"] = spec_field(
        "mpirun", doc="how the driver starts the ranks: mpirun (its daemons started through "
        "Slurm), or srun --mpi=<launch.pmi> (Slurm starts each rank itself)")
    mpi: Literal["openmpi", "mpich", "intel"] = spec_field("openmpi", doc="MPI flavour of the ranks")
    pmi: Literal["pmix", "pmix_v3", "pmix_v4", "pmi2"] = spec_field(
        "pmix", doc="srun's --mpi plugin (launch.method srun); Open MPI needs pmix")
    network_interface: Optional[str] = spec_field(
        None, doc="the network for MPI, Gloo, NCCL and Horovod: an interface name (ib0) or a "
        "subnet (10.1.0.0/16); None = each library's own choice", check=values.check_interface,
        example="ib0")
    extra_args: list[str] = spec_field(doc="extra arguments to the launcher (mpirun or srun), "
                                       "one per item", factory=list, each=values.check_argument)
    env: dict[str, str] = spec_field(doc="environment variables exported to every rank",
                                     factory=dict, key_check=values.check_env_name,
                                     each=values.check_env_value)
    stall_seconds: Union[float, Literal["auto"]] = spec_field(
        DEFAULT_STALL_SECONDS, doc="the driver tears the ranks down when no rank progresses for this long, "
        "and starts them again from the last checkpoint (launch.restarts_in_job, then "
        "checkpoint.retries_on_failure; else the job fails): longer than start-up, one step, "
        "one evaluation batch and one checkpoint save; auto: 5x the longest step or save seen so far, at least 60 s "
        "(10 minutes before the first step, and in a first save)", ge=5)
    start_seconds: float = spec_field(
        AUTO_START_SECONDS, doc="until every rank has begun its first step in a start (imports, "
        "the network, copying shards, building the model, resuming), the watchdog waits this "
        "long or launch.stall_seconds, the longer: start-up varies with the file system and the "
        "node's load far more than a step does (ft_launcher's initial heartbeat timeout)", ge=5)
    straggler_warn: Optional[float] = spec_field(
        1.5, doc="the driver records a `straggler` warning when the slowest rank's own time per "
        "step (the step less its wait for the others' gradients) reaches this many times the "
        "other ranks' median; None = never", ge=1, example=1.5)

    @property
    def stall_limit(self) -> float:
        """stall_seconds as one number for waits that cannot follow `auto` (the checkpoint
        writer's): `auto`'s bound before the first step, its loosest."""
        return AUTO_START_SECONDS if self.stall_seconds == AUTO else self.stall_seconds
    restarts_in_job: int = spec_field(
        2, doc="after a rank's failure or a stall, start the ranks again from the last "
        "checkpoint inside the same allocation, up to this many times per job, before "
        "requeueing (checkpoint.retries_on_failure); 0 = always requeue", ge=0)
    preemption_sentinel: bool = spec_field(
        True, doc="under Slurm with mpirun, a one-task step (srun --overlap) that hears a "
        "preemption's grace start, which Slurm signals to the job's steps only: the ranks then "
        "save a stop at once instead of at the grace's end; false = no such step (srun's ranks "
        "hear it themselves)")


@dataclass(frozen=True)
class DataSpec:
    kind: Literal["synthetic", "hdf5", "text", "tokens", "dataset"] = spec_field(
        "synthetic", doc="where samples come from: synthetic or hdf5 images; text (a generated "
        "corpus) or tokens (HDF5 token shards) for the gpt model; dataset: your own map-style "
        "dataset (data.dataset)")
    dataset: Optional[str] = spec_field(
        None, doc="kind dataset: package.module:callable returning your torch Dataset (with "
        "__len__, items (input, target)) for a split; called as callable(split, **data.options), "
        "split 'train' or 'val' (return None for no validation split)",
        check=values.check_reference, example="my_lab.data:images")
    options: dict[str, Any] = spec_field(
        doc="kind dataset: keyword arguments of data.dataset (paths, sizes, ...)", factory=dict)
    path: Optional[str] = spec_field(None, doc="directory of HDF5 shards (kind hdf5 or tokens)",
                                     check=values.check_path, example="/path/to/imagenet-shards")
    num_classes: int = spec_field(1000, doc="classes of image data (token data: vocab_size)",
                                  ge=2)
    image_size: int = spec_field(224, doc="square crop size in pixels", ge=8, le=1024)
    vocab_size: int = spec_field(BYTE_VOCAB, doc="token values of text and tokens data "
                                 f"({BYTE_VOCAB}: byte tokens); the gpt model's vocabulary", ge=2)
    seq_len: int = spec_field(128, doc="tokens per training sequence (text and tokens data)",
                              ge=2)
    batch_size: int = spec_field(32, doc="samples per rank per backward pass (per-rank batch); "
                                 "with a pipeline, per replica (all its stages see the same ones)",
                                 ge=1)
    copy_to: Optional[str] = spec_field(
        None, doc="copy the shards to this node-local directory before training and read them "
        "there (one copy per node, checked against the manifest; kept across requeues on the "
        "node); $VARIABLES are expanded on the node", check=values.check_path,
        example="$SLURM_TMPDIR")
    workers: int = spec_field(4, doc="data loader worker processes per rank", ge=0)
    pin_memory: bool = spec_field(True, doc="pin host memory for faster copies to the GPU")
    normalize_on: Literal["auto", "device", "workers"] = spec_field(
        "auto", doc="hdf5 images: where pixels become normalised floats. device: the workers "
        "hand over uint8 (4x fewer bytes through worker queues and the host-to-device copy) and "
        "the rank normalises on its GPU; workers: float32 from the workers; auto: device when "
        "the rank trains on a GPU, workers on CPU (the numbers are the same either way)")
    start_method: Literal["fork", "forkserver", "spawn"] = spec_field(
        "forkserver", doc="multiprocessing start method of the data workers. forkserver: they "
        "fork from a clean process started before MPI, not from the rank with its MPI and "
        "other threads (a lock one held at the fork would be held in the worker for ever); "
        "fork: a few seconds sooner to the first batch, for jobs without MPI")
    train_samples: Optional[int] = spec_field(
        None, doc="synthetic: samples per epoch, all ranks together", ge=1, example=2048)
    val_samples: Optional[int] = spec_field(
        None, doc="synthetic: validation samples, all ranks together", ge=0, example=256)


@dataclass(frozen=True)
class ModelSpec:
    name: Union[ModelName, str] = spec_field(
        "resnet50", doc="architecture from the model catalog (hpc_train/models/catalog.py), or "
        "your own: package.module:callable returning a torch.nn.Module, called with "
        "model.options as keyword arguments", check=values.choice_or_reference(MODEL_NAMES, "model"))
    # Only the options given, converted: the defaults have one home, the catalog, and a loaded
    # spec equals one built by hand.
    options: dict[str, Any] = spec_field(
        doc="the model's own options, as declared in its catalog entry (unset ones take the "
        "catalog's defaults); for your own model, its keyword arguments", factory=dict,
        declared_by=lambda model: options_of(model["name"]))
    blocks: Optional[str] = spec_field(
        None, doc="with parallel.pipeline.stages > 1 and your own model: package.module:callable "
        "called as blocks(model) on the built model, returning its blocks in order (nn.Modules "
        "whose composition is the forward: the first takes the token ids, each maps one tensor "
        "to one tensor, the last returns the logits); the stages cut this list. null: the "
        "model's children if it is an nn.Sequential", check=values.check_reference,
        example="my_lab.models:blocks")


class TaskKind(str, Enum):
    """What a step computes (`JobSpec.task_kind`); the ranks' side is train/task.py."""
    CLASSIFICATION = "classification"
    CAUSAL_LM = "causal_lm"
    OWN = "own"                 # the user's step function (task.name a reference)


TASK_NAMES = ("auto", TaskKind.CLASSIFICATION.value, TaskKind.CAUSAL_LM.value)


@dataclass(frozen=True)
class TaskSpec:
    name: Union[Literal[TASK_NAMES], str] = spec_field(
        "auto", doc="what a step computes. classification: cross-entropy of model(input) "
        "against a class index, validation accuracy; causal_lm: next-token cross-entropy of "
        "(batch, sequence, vocabulary) logits (or an output with .logits, as Hugging Face's) "
        "against (batch, sequence) targets, next-token accuracy; or your own step, "
        "package.module:callable called as step(model, (input, target)) and returning the loss "
        "or (loss, {name: number}) (the numbers are logged, averaged); auto: causal_lm for "
        "token data and the gpt model, classification otherwise. Mixed precision, "
        "accumulation, clipping, the loss scaler and the LR schedule stay ours",
        check=values.choice_or_reference(TASK_NAMES, "step function"))
    eval: Optional[str] = spec_field(
        None, doc="with your own step: package.module:callable called as eval(model, (input, "
        "target)) on each validation batch (no gradients, the model in eval mode), returning "
        "the loss or (loss, {name: number}); null: the step itself",
        check=values.check_reference, example="my_lab.tasks:eval_step")


@dataclass(frozen=True)
class OptimSpec:
    name: Union[Literal["sgd", "adamw"], str] = spec_field(
        "sgd", doc="optimizer: sgd, adamw, or package.module:callable (torch.optim:RAdam, your "
        "own) called as callable(params, lr=..., **optim.options); the LR schedule stays ours",
        check=values.choice_or_reference(("sgd", "adamw"), "optimizer"))
    options: dict[str, Any] = spec_field(
        doc="keyword arguments of an optimizer named by reference (optim.name)", factory=dict)
    base_lr: float = spec_field(0.1, doc="learning rate per 256 samples; scaled by samples per "
                                "optimizer step", gt=0)
    momentum: float = spec_field(0.9, doc="SGD momentum (beta1 for adamw)", ge=0, le=1)
    weight_decay: float = spec_field(1e-4, doc="L2 / decoupled weight decay", ge=0)
    nesterov: bool = spec_field(False, doc="Nesterov momentum (sgd)")
    warmup_epochs: float = spec_field(5.0, doc="linear warm-up from 0 to the scaled LR", ge=0)
    schedule: Literal["cosine", "step", "constant"] = spec_field("cosine", doc="LR after warm-up")
    step_milestones: list[int] = spec_field(doc="epochs where the step schedule multiplies the LR",
                                            factory=lambda: [30, 60, 80],
                                            check=values.check_increasing)
    step_gamma: float = spec_field(0.1, doc="factor applied at each milestone", gt=0, le=1)
    label_smoothing: float = spec_field(0.0, doc="cross-entropy label smoothing", ge=0, lt=1)
    epochs: int = spec_field(90, doc="epochs to train", ge=1)
    max_steps: Optional[int] = spec_field(None, doc="stop after this many optimizer steps (tests)",
                                          ge=1, example=100)
    grad_clip: Optional[float] = spec_field(None, doc="clip the global gradient norm to this",
                                            gt=0, example=1.0)


@dataclass(frozen=True)
class PrecisionSpec:
    mode: Literal["fp32", "fp16", "bf16"] = spec_field("fp32", doc="compute precision (autocast)")
    loss_scale: Union[Literal["dynamic"], float] = spec_field(
        "dynamic", doc='fp16 loss scale: "dynamic" (GradScaler) or a fixed number', gt=0)
    init_scale: float = spec_field(DEFAULT_INIT_SCALE, doc="first scale of the dynamic loss scaler", gt=0)


@dataclass(frozen=True)
class PipelineSpec:
    stages: int = spec_field(1, doc="pipeline stages K (ranks per model copy); 1 = no pipeline",
                             ge=1)
    microbatches: int = spec_field(1, doc="micro-batches M per step; the idle bubble is "
                                   "(K-1)/(M+K-1), so use M >= 4K", ge=1)
    schedule: Literal["gpipe", "1f1b"] = spec_field(
        "gpipe", doc="gpipe: all forwards, then all backwards; 1f1b: interleaved, keeps at most "
        "K micro-batches of activations")
    balance: Union[Literal["auto", "time"], list[int]] = spec_field(
        "auto", doc="blocks per stage: auto (by parameter count), time (by timing each block on "
        "one micro-batch), or a list [n0, n1, ...] over the gpt block list (layers + 2) or "
        "your model's blocks (model.blocks)",
        example="[3, 3]")
    remat: bool = spec_field(False, doc="rematerialization: recompute activations in backward "
                             "(far less memory for about a third more compute)")


@dataclass(frozen=True)
class HorovodSpec:
    """Horovod's own performance knobs, passed to every rank as its HOROVOD_* variables
    (launch/horovod.py); None leaves Horovod's default."""
    fusion_threshold_mb: Optional[int] = spec_field(
        None, doc="tensor fusion buffer in MiB (HOROVOD_FUSION_THRESHOLD): gradients ready in "
        "the same cycle are packed into one allreduce up to this size; 0 turns fusion off",
        ge=0, le=4096, example=64)
    cycle_time_ms: Optional[float] = spec_field(
        None, doc="milliseconds between Horovod's fusion cycles (HOROVOD_CYCLE_TIME): longer "
        "packs more gradients per allreduce, shorter starts them sooner", gt=0, le=1000,
        example=2.5)
    hierarchical_allreduce: bool = spec_field(
        False, doc="reduce within each node first, then across nodes "
        "(HOROVOD_HIERARCHICAL_ALLREDUCE; Horovod implements it for NCCL, i.e. GPU jobs)")
    timeline: bool = spec_field(
        False, doc="record Horovod's timeline (HOROVOD_TIMELINE) into the run directory as "
        "horovod-timeline.json (horovod-timeline-N.json after the Nth requeue); open it in "
        "chrome://tracing or ui.perfetto.dev")
    autotune: bool = spec_field(
        False, doc="let Horovod tune fusion threshold, cycle time and hierarchical allreduce "
        "while training (HOROVOD_AUTOTUNE; knobs set here stay fixed); its log is kept in the "
        "run directory as horovod-autotune.csv")
    few_core_tuning: bool = spec_field(
        True, doc="on one core per rank (slurm.cpus_per_task: 1), keep Horovod's background "
        "thread and MPI's polling off the training's core: a 2 ms cycle (unless cycle_time_ms "
        "is set) and Open MPI's mpi_yield_when_idle (launch/horovod.py; measured in "
        "docs/benchmarks.md). launch.env overrides either")


@dataclass(frozen=True)
class FsdpSpec:
    """torch FSDP2's settings (parallel.backend: fsdp): parameters, gradients and optimizer
    state sharded over the ranks, one unit per block of the model (parallel/fsdp.py)."""
    reshard_after_forward: bool = spec_field(
        True, doc="free each block's gathered parameters after its forward and gather them "
        "again in backward (ZeRO-3's memory); false keeps them to backward (ZeRO-2's traffic)")
    param_dtype: Optional[Literal["fp32", "bf16", "fp16"]] = spec_field(
        None, doc="dtype of the gathered parameters in forward and backward (half the "
        "all-gather bytes); null: fp32, autocast computing in precision.mode's dtype. Not with "
        "BatchNorm models (resnet*): their running statistics stay fp32", example="bf16")
    reduce_dtype: Optional[Literal["fp32", "bf16", "fp16"]] = spec_field(
        None, doc="dtype of the gradient reduce-scatter; null: fp32", example="bf16")
    cpu_offload: bool = spec_field(
        False, doc="keep the sharded parameters, gradients and optimizer state in host memory "
        "(the optimizer steps on the CPU); for GPU jobs whose state does not fit")
    units: list[str] = spec_field(
        doc="class names of the submodules sharded one by one (e.g. your model's block class); "
        "empty: the catalog's blocks, or your model's fsdp_units()", factory=list,
        each=values.check_class_name, example=["Block"])


@dataclass(frozen=True)
class DeepSpeedSpec:
    """DeepSpeed ZeRO (parallel.backend: deepspeed): what each rank keeps a shard of, and the
    rest of DeepSpeed's config (parallel/deepspeed_config.py builds the whole of it)."""
    stage: int = spec_field(1, doc="ZeRO stage: 1 shards the optimizer state over the ranks, 2 "
                            "also the gradients, 3 also the parameters", ge=1, le=3)
    offload_optimizer: Literal["none", "cpu"] = spec_field(
        "none", doc="cpu: keep the optimizer state in host memory and step it there (ZeRO-Offload)")
    offload_params: Literal["none", "cpu"] = spec_field(
        "none", doc="cpu: keep the parameters in host memory between their uses (stage 3 only)")
    overlap_comm: bool = spec_field(False, doc="reduce gradients while backward goes on (more "
                                    "memory for the buckets)")
    config: dict[str, Any] = spec_field(
        factory=dict, doc="more of DeepSpeed's config, passed through as given; checked against "
        "DeepSpeed's own config model at validate. Keys the spec owns (batch, accumulation, "
        "clipping, precision, optimizer, the ZeRO keys above) are refused", example="{steps_per_print: 100}")


@dataclass(frozen=True)
class PowerSgdSpec:
    """DDP's PowerSGD gradient compression (parallel.compression: powersgd): each gradient
    matrix sent as two low-rank factors, the error left out fed back into the next step."""
    rank: int = spec_field(4, doc="rank of the factors: bytes on the wire per n x m gradient "
                           "are about rank x (n + m) instead of n x m; higher is closer to "
                           "uncompressed", ge=1, le=64)
    start_step: int = spec_field(
        10, doc="optimizer steps of plain allreduce before compressing (the first steps move "
        "the weights most; DDP needs two before its buckets are final)", ge=2)
    warm_start: bool = spec_field(
        True, doc="start each step's factors from the last step's (fewer bytes for the same "
        "error); false draws them afresh")


@dataclass(frozen=True)
class ParallelSpec:
    backend: Literal["horovod", "ddp", "fsdp", "deepspeed"] = spec_field(
        "horovod", doc="data-parallel library: horovod, ddp (replicated), fsdp (torch FSDP2, "
        "sharded; parallel.fsdp), deepspeed (DeepSpeed's ZeRO engine, the `deepspeed` extra; "
        "parallel.deepspeed says what it shards)")
    accumulation: int = spec_field(1, doc="backward passes per optimizer step", ge=1)
    compression: Literal["none", "fp16", "bf16", "powersgd"] = spec_field(
        "none", doc="gradient compression on the wire: fp16 halves the allreduce bytes "
        "(Horovod's DistributedOptimizer, or DDP's communication hook); bf16 (DDP) halves "
        "them with fp32's range; powersgd (DDP) sends low-rank factors with error feedback "
        "(parallel.powersgd)")
    powersgd: PowerSgdSpec = field(default_factory=PowerSgdSpec)
    pipeline: PipelineSpec = field(default_factory=PipelineSpec)
    horovod: HorovodSpec = field(default_factory=HorovodSpec)
    fsdp: FsdpSpec = field(default_factory=FsdpSpec)
    deepspeed: DeepSpeedSpec = field(default_factory=DeepSpeedSpec)
    # A resume on another world size (spec/global_batch.py, slurm/resume.py).
    keep_global_batch: bool = spec_field(
        False, doc="on a resume at another world size, keep the last checkpoint's samples per "
        "step (and so the peak LR) by changing parallel.accumulation; refused where it does not "
        "divide. false: the samples per step follow the ranks, the peak LR the linear rule")


@dataclass(frozen=True)
class CheckpointSpec:
    every_steps: Optional[int] = spec_field(None, doc="save every N optimizer steps", ge=1,
                                            example=1000)
    every_minutes: Optional[float] = spec_field(30.0, doc="save every N minutes of training",
                                                gt=0)
    keep_last: int = spec_field(3, doc="keep this many most recent checkpoints", ge=1)
    # Named `write`, not `async`: spec keys are dataclass fields, and async is a Python keyword.
    write: Literal["async", "sync"] = spec_field(
        "async", doc="async: training waits only for a copy of the state in host memory "
        "(pinned on GPUs) while a background thread writes it with the same atomic protocol; "
        "a stop and the end of training wait for the write. sync: training waits for the "
        "whole save. Costs host memory the size of the checkpoint")
    keep_every: Optional[int] = spec_field(
        None, doc="also keep for good one checkpoint per this many steps (the first saved at "
        "or after each multiple)", ge=1, example=10000)
    max_requeues: int = spec_field(10, doc="requeues after a time-limit stop before giving up",
                                   ge=0)
    retries_on_failure: int = spec_field(0, doc="requeues from the last checkpoint after a "
                                         "crash (non-zero exit) or a hang (launch.stall_seconds), "
                                         "once launch.restarts_in_job are spent",
                                         ge=0)
    retries_on_node_failure: int = spec_field(
        3, doc="requeues without the node after a node of the job died (its launcher daemon "
        "lost, Slurm showing it not responding); they spend no checkpoint.retries_on_failure",
        ge=0)


@dataclass(frozen=True)
class WandbSpec:
    """Weights & Biases (log.trackers: wandb); files under the run directory's wandb/."""
    mode: Literal["offline", "online"] = spec_field(
        "offline", doc="offline: write the run's files only (compute nodes often have no "
        "internet), then `wandb sync` them from the login node (`status` prints the command); "
        "online: send them as the run goes")
    project: Optional[str] = spec_field(None, doc="W&B project; null: the run's run.name",
                                        example="imagenet")
    entity: Optional[str] = spec_field(None, doc="W&B entity (user or team); null: W&B's "
                                       "default for the account", example="my-team")
    name: Optional[str] = spec_field(None, doc="W&B run name; null: the run directory's name",
                                     example="resnet50-baseline")


@dataclass(frozen=True)
class MlflowSpec:
    """MLflow (log.trackers: mlflow)."""
    tracking_uri: Optional[str] = spec_field(
        None, doc="where MLflow writes: a URI (file:/path, http://host:5000, databricks); "
        "null: a file store under the run directory, file:RUN/mlruns",
        example="http://mlflow.example.org:5000")
    experiment: Optional[str] = spec_field(None, doc="MLflow experiment name; null: the run's "
                                           "run.name", example="imagenet")


@dataclass(frozen=True)
class LogSpec:
    every_steps: int = spec_field(20, doc="log metrics every N optimizer steps", ge=1)
    tensorboard: bool = spec_field(True, doc="the default of log.trackers: true is "
                                   "[tensorboard], false is []; ignored once log.trackers is set")
    trackers: Optional[list[Literal[tuple(t.value for t in Tracker)]]] = spec_field(
        None, doc="experiment trackers rank 0 writes the metrics (loss, lr, images/s, eval "
        "accuracy), the spec (flattened, as parameters) and the final checkpoint's path to: "
        "tensorboard (tensorboard/), wandb (log.wandb) and mlflow (log.mlflow), the latter two "
        "optional extras; every requeue and resume goes on with the same tracker run; null: "
        "from log.tensorboard", example="[tensorboard, mlflow]")
    wandb: WandbSpec = field(default_factory=WandbSpec)
    mlflow: MlflowSpec = field(default_factory=MlflowSpec)
    rank_logs: Literal[tuple(m.value for m in RankLogs)] = spec_field(
        "auto", doc="where the ranks' output goes: per_rank, logs/rank-N.log (one shared file "
        "per rank); per_node, a file per rank on its node, gathered by one rank of the node "
        "into logs/node-<host>.log once per heartbeat interval (lines prefixed [rank N]; a "
        f"node that dies loses at most its last interval); auto: per_rank up to {PER_NODE_ABOVE} "
        "ranks, per_node above")

    @property
    def chosen_trackers(self) -> tuple[Tracker, ...]:
        """The trackers rank 0 writes to: log.trackers in its order, once each, or from
        log.tensorboard when log.trackers is null."""
        if self.trackers is None:
            return (Tracker.TENSORBOARD,) if self.tensorboard else ()
        return tuple(dict.fromkeys(Tracker(name) for name in self.trackers))


def scale_lr(base_lr: float, samples_per_step: int, *, reference_batch: int = 256) -> float:
    """Linear scaling rule: `base_lr * samples_per_step / reference_batch` (Goyal et al. 2017).

    `samples_per_step` is the batch of one optimizer step over all ranks (`JobSpec.
    samples_per_step`): per-replica batch x replicas x accumulation steps.
    """
    if not base_lr > 0:
        raise ValueError(f"base_lr must be > 0, got {base_lr!r}")
    if isinstance(samples_per_step, bool) or not isinstance(samples_per_step, int) \
            or samples_per_step < 1:
        raise ValueError(f"samples_per_step must be a positive integer, got {samples_per_step!r}")
    if reference_batch < 1:
        raise ValueError(f"reference_batch must be >= 1, got {reference_batch!r}")
    return base_lr * samples_per_step / reference_batch


@dataclass(frozen=True)
class JobSpec:
    """A whole job. Sections are the top-level YAML keys; only `run.name` has no default."""

    run: RunSpec
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    data: DataSpec = field(default_factory=DataSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    precision: PrecisionSpec = field(default_factory=PrecisionSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    log: LogSpec = field(default_factory=LogSpec)

    @property
    def world_size(self) -> int:
        """Ranks in the job: nodes x tasks_per_node."""
        return self.slurm.nodes * self.slurm.tasks_per_node

    @property
    def layout(self) -> ParallelLayout:
        """World size x pipeline stages, and everything derived from them (replicas, each rank's
        stage, replica and data part); raises LayoutError when the ranks do not form whole
        pipelines (the submit-time rule `whole_pipelines` reports that first)."""
        return ParallelLayout(self.world_size, self.parallel.pipeline.stages, self.parallelism)

    @property
    def parallelism(self) -> Parallelism:
        """FSDP for parallel.backend fsdp and DeepSpeed's engine for deepspeed (stages > 1 is
        refused by a rule for both; gpt runs whole on every rank); else the pipeline for
        stages > 1 (gpt's block list, or your model's blocks: model.blocks) or a block-list
        model (gpt; one stage is then plain data parallelism of the block list), data
        parallelism for the rest."""
        if self.parallel.backend == "fsdp":
            return Parallelism.FSDP
        if self.parallel.backend == "deepspeed":
            return Parallelism.DEEPSPEED
        pipeline = self.uses_pipeline or model_entry(self.model.name).block_list
        return Parallelism.PIPELINE if pipeline else Parallelism.DATA_PARALLEL

    @property
    def replicas(self) -> int:
        """Data-parallel copies of the model (asked of the layout)."""
        return self.layout.replicas

    @property
    def uses_pipeline(self) -> bool:
        return self.parallel.pipeline.stages > 1

    @property
    def task_kind(self) -> TaskKind:
        """task.name resolved: auto is causal_lm for token data or a block-list model (gpt),
        classification otherwise."""
        name = self.task.name
        if name == "auto":
            tokens = self.data.kind in TOKEN_KINDS or model_entry(self.model.name).block_list
            return TaskKind.CAUSAL_LM if tokens else TaskKind.CLASSIFICATION
        return TaskKind(name) if name in TASK_NAMES else TaskKind.OWN

    @property
    def samples_per_step(self) -> int:
        """Samples per optimizer step: per-replica batch x replicas x accumulation (without a
        pipeline every rank is a replica). One backward pass of all ranks is `accumulation`
        times fewer (the sampler's `samples_per_pass`)."""
        return self.data.batch_size * self.replicas * self.parallel.accumulation

    @property
    def scaled_lr(self) -> float:
        """The peak LR of the schedule: base_lr (per 256 samples) scaled by `scale_lr`."""
        return scale_lr(self.optim.base_lr, self.samples_per_step)

    @property
    def time_seconds(self) -> int:
        """The limit as Slurm enforces it (whole minutes: Resources.time_minutes)."""
        return self.slurm.time_minutes * 60

    @property
    def uses_gpu(self) -> bool:
        return self.slurm.gpus_per_node > 0
