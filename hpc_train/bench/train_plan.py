"""`bench train`'s matrix: the configurations, the spec each one runs, and the launches that run
them in alternating rounds (pure functions; no torch).

A configuration is the trainer (`kind` "trainer": the real Trainer on the spec's model) or the
bare loop (`kind` "bare": the same model, batch, precision and backend in a plain PyTorch loop,
the baseline of the trainer's overhead), with a backend, precision, compression, rank count,
accumulation and data source. The backends are the spec's parallel.backend values, with
DeepSpeed named by its ZeRO stage: `zero1`, `zero2`, `zero3` (parallel.backend deepspeed with
parallel.deepspeed.stage 1, 2, 3); the bare loop exists for ddp and horovod only. One launch
runs every configuration of one rank count once, a trainer and its bare baseline interleaved;
the rounds alternate the order of launches and of configurations within them (reversed every
other round), so load from other work on a shared machine falls on all of them alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hpc_train.errors import HpcTrainError
from hpc_train.spec.compression_rules import COMPRESSIONS as BY_BACKEND

BACKENDS = ("ddp", "horovod", "fsdp", "zero1", "zero2", "zero3")
PRECISIONS, COMPRESSIONS = ("fp32", "fp16", "bf16"), ("none", "fp16", "bf16", "powersgd")
DATA_KINDS = ("synthetic", "real")
BARE_BACKENDS = ("ddp", "horovod")      # the bare loop's: a plain PyTorch loop has no sharding
DEFAULT_BACKENDS = BARE_BACKENDS        # the sharded rows are asked for: --backends
ZERO_PREFIX = "zero"


def spec_backend(backend: str) -> tuple[str, int | None]:
    """(parallel.backend, parallel.deepspeed.stage or None) of a bench backend name."""
    if backend.startswith(ZERO_PREFIX):
        return "deepspeed", int(backend.removeprefix(ZERO_PREFIX))
    return backend, None


@dataclass(frozen=True)
class Config:
    kind: str            # "trainer" | "bare"
    backend: str
    precision: str
    compression: str
    ranks: int
    accumulation: int
    data: str            # "synthetic" | "real" (the spec's own data)

    @property
    def name(self) -> str:
        """Unique, and a directory name: configs/<name>/ holds its spec and metrics."""
        return (f"{self.kind}-{self.backend}-{self.precision}-c{self.compression}-"
                f"a{self.accumulation}-n{self.ranks}-{self.data}")

    def as_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


@dataclass(frozen=True)
class Matrix:
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    precisions: tuple[str, ...] = ("fp32", "fp16")
    compressions: tuple[str, ...] = ("none", "fp16")
    ranks: tuple[int, ...] = ()          # () = 1 and the spec's world size
    accumulations: tuple[int, ...] = (1,)
    data: tuple[str, ...] = DATA_KINDS
    bare: bool = True


@dataclass(frozen=True)
class SpecData:
    """What the spec's data allows: files to read (`real` differs from `synthetic`); token
    sequences (`text`: a generated corpus, token shards, a user's dataset of a causal LM); a
    user's own dataset (`dataset`), whose model expects its samples."""
    real: bool
    text: bool = False
    dataset: bool = False

    @property
    def own_only(self) -> bool:
        """No synthetic images stand in for this data: both loops read the spec's own."""
        return self.text or self.dataset


def parse_list(text: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    bad = [item for item in items if item not in allowed]
    if not items or bad:
        raise HpcTrainError(f"{option} {text!r}: comma-separated values from {', '.join(allowed)}")
    return items


def parse_counts(text: str, option: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 1:
        raise HpcTrainError(f"{option} {text!r}: comma-separated whole numbers >= 1")
    return counts


def configurations(matrix: Matrix, world_size: int, data: SpecData,
                   deepspeed: bool = True) -> tuple[list[Config], list[str]]:
    """Every configuration of the matrix for a spec of `world_size` ranks, and one line for each
    backend left out. Each compression runs under the backends that run it (Horovod: fp16;
    DDP: fp16, bf16, powersgd; spec/compression_rules.py), the others without; the bare loop
    runs once per backend of BARE_BACKENDS, precision and rank count (no compression or
    accumulation; synthetic images, or the spec's own data where they cannot stand in for it) as
    the trainer's baseline. `deepspeed`: whether
    DeepSpeed is installed here (else its rows are left out, named)."""
    ranks = matrix.ranks or tuple(sorted({1, world_size}))
    if bad := [n for n in ranks if n > world_size]:
        raise HpcTrainError(f"--ranks {bad}: more than the spec's {world_size} ranks (the allocation)")
    if data.own_only and "real" not in matrix.data:
        what = "text" if data.text else "a dataset of your own"
        raise HpcTrainError(f"--data synthetic: this spec's data is {what}, which no synthetic "
                            "images stand in for; use --data real")
    sources = ["real"] if data.own_only else [d for d in matrix.data if d == "synthetic" or data.real]
    if not sources:
        raise HpcTrainError("--data real: this spec's data is synthetic; use --data synthetic")
    skipped = [] if deepspeed else [
        f"bench train: {b} left out: DeepSpeed is not installed here (bash env/setup.sh installs it)"
        for b in matrix.backends if spec_backend(b)[0] == "deepspeed"]
    backends = [b for b in matrix.backends if deepspeed or spec_backend(b)[0] != "deepspeed"]
    configs = []
    for n in ranks:
        for source in sources:
            for backend in backends:
                for precision in matrix.precisions:
                    for compression in matrix.compressions:
                        if compression not in BY_BACKEND.get(spec_backend(backend)[0], ("none",)):
                            continue
                        for accumulation in matrix.accumulations:
                            configs.append(Config("trainer", backend, precision, compression, n,
                                                  accumulation, source))
        if matrix.bare:
            source = "real" if data.own_only else "synthetic"
            configs += [Config("bare", backend, precision, "none", n, 1, source)
                        for backend in backends if backend in BARE_BACKENDS
                        for precision in matrix.precisions if source in sources]
    return configs, skipped


def twin(bare: Config, configs: list[Config]) -> Config | None:
    """The trainer configuration a bare loop is the baseline of: same backend, precision, ranks
    and data, no compression, accumulation 1."""
    wanted = ("trainer", bare.backend, bare.precision, bare.ranks, bare.data, "none", 1)
    return next((c for c in configs if (c.kind, c.backend, c.precision, c.ranks, c.data, c.compression,
                                        c.accumulation) == wanted), None)


def units(configs: list[Config]) -> list[list[str]]:
    """What a launch runs, in order: a trainer configuration with its bare-loop baseline as a
    pair (their steps interleaved in short chunks: the overhead ratio is then measured under
    the same load, second by second), every other configuration alone."""
    bare_of = {}
    for c in configs:
        if c.kind == "bare" and (trainer := twin(c, configs)) is not None:
            bare_of[trainer.name] = c.name
    paired = set(bare_of.values())
    return [[c.name, bare_of[c.name]] if c.name in bare_of else [c.name]
            for c in configs if c.name not in paired]


def launches(configs: list[Config], rounds: int) -> list[dict]:
    """The launches in order: each round runs every rank count once (one launch each), the
    order of launches and of units within them reversed every other round."""
    counts = sorted({c.ranks for c in configs})
    plan = []
    for round_ in range(rounds):
        flip = round_ % 2 == 1
        for n in reversed(counts) if flip else counts:
            order = units([c for c in configs if c.ranks == n])
            plan.append({"id": len(plan), "round": round_, "ranks": n,
                         "units": list(reversed(order)) if flip else order})
    return plan


def config_overrides(config: Config, world_size: int, samples_per_rank_step: int,
                     steps: int) -> list[str]:
    """`--set` overrides that turn the spec into this configuration's. One rank out of several
    runs on one node with one task. No checkpoint every N steps among the measured ones.
    Synthetic data gets enough samples that the measured steps fit in one epoch (no evaluation,
    no epoch-end checkpoint among them) and no validation."""
    backend, stage = spec_backend(config.backend)
    overrides = [f"parallel.backend={backend}", f"precision.mode={config.precision}",
                 f"parallel.compression={config.compression}",
                 f"parallel.accumulation={config.accumulation}", "optim.max_steps=null",
                 "checkpoint.every_steps=null", "checkpoint.every_minutes=null",
                 "checkpoint.keep_every=null"]
    if stage is not None:
        overrides.append(f"parallel.deepspeed.stage={stage}")
    if config.ranks != world_size:
        if config.ranks != 1:
            raise HpcTrainError(f"--ranks {config.ranks}: only 1 and the whole allocation "
                                f"({world_size}) are laid out by the benchmark")
        overrides += ["slurm.nodes=1", "slurm.min_nodes=null", "slurm.tasks_per_node=1"]
    if config.data == "synthetic":
        samples = samples_per_rank_step * config.accumulation * config.ranks * (steps + 2)
        overrides += ["data.kind=synthetic", "data.path=null", f"data.train_samples={samples}",
                      "data.val_samples=0"]
    return overrides
