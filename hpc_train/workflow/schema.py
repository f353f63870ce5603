"""A workflow file as typed, frozen dataclasses, checked by the job spec's own machinery
(spec.load.build_dataclass): unknown keys with a suggestion, types, limits, one line each.

    name: smoke-chain            # the workflow directory is <root>/<name>-<stamp>/
    root: runs
    slurm: {time: "00:10:00"}    # defaults for the jobs of stages that are not train stages
    stages:
      shard_train: {kind: shard, src: data/demo/train, out: "{workflow.dir}/shards", tasks: 2}
      train: {kind: train, after: [shard_train], spec: jobs/smoke.yaml,
              set: {data.path: "{shard_train.out}"}}

A stage's kind picks its dataclass (KINDS). Train stages take their resources from their job
spec; the other kinds run one small job each, a shard stage an array of them, with a `slurm:`
section of the same keys (spec.Resources: one task on one node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from hpc_train.spec import Problem, Resources, values
from hpc_train.spec.schema import spec_field

STAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
RESERVED = ("workflow",)          # `{workflow.dir}` names the workflow itself
# A sweep's metric: the last `val` (or train) line of metrics.jsonl, one of its fields.
METRIC = re.compile(r"(val|train)\.[A-Za-z_][A-Za-z0-9_]*")
MAX_TASKS = 1000                  # below Slurm's default MaxArraySize (1001)


def check_stage_name(text: str):
    if not STAGE_NAME.fullmatch(text):
        return ("stage names are 1-40 letters, digits and _, not starting with a digit: they "
                "appear in references ({train.run_dir}), --set and job names",
                "rename it, e.g. shard_train")
    if text in RESERVED:
        return ("'workflow' names the workflow itself in references ({workflow.dir})",
                "give the stage another name")
    return None


check_metric = values.pattern_check(
    METRIC, "a metric is val.<field> or train.<field>: that field of the run's last val (or "
    "train) line in metrics.jsonl", "write e.g. best_by: val.accuracy")
check_spec_key = values.pattern_check(values.DOTTED_KEY, "a job spec key is dotted, SECTION.KEY, "
                                      "as with --set", "write e.g. optim.base_lr")


STAGE_DEFAULTS = {"mem": "4G"}    # without --mem, a site may give a stage's small job a whole node's
OLD_STAGE_KEYS = {"cpus": "cpus_per_task", "gpus": "gpus_per_node"}   # read with a warning (load.py)


# Fields every stage has. `slurm` is read apart (merged over the workflow's defaults).
_AFTER_DOC = "stages that must end COMPLETED first (Slurm's afterok: every task of an array)"
_ANY_DOC = "stages that must end first, however they end (Slurm's afterany)"


@dataclass(frozen=True, kw_only=True)
class Stage:
    kind: str = spec_field(doc="shard, train, evaluate, export or command")
    after: list[str] = spec_field(doc=_AFTER_DOC, factory=list)
    after_any: list[str] = spec_field(doc=_ANY_DOC, factory=list)

    @property
    def needs(self) -> list[str]:
        return [*self.after, *self.after_any]


@dataclass(frozen=True, kw_only=True)
class ShardStage(Stage):
    src: str = spec_field(doc="the split's image folder", check=values.check_path,
                          example="/data/imagenet/train")
    out: str = spec_field(doc="output root: the shards go to OUT/SPLIT", check=values.check_path,
                          example="/scratch/imagenet-shards")
    split: str = spec_field("train", doc="split name and output subfolder",
                            check=values.check_run_name)
    labels: Optional[str] = spec_field(None, doc="flat folder: the labels file",
                                       check=values.check_path, example="LOC_val_solution.csv")
    classes: Optional[str] = spec_field(None, doc="class names in index order (train's manifest "
                                        "for val)", check=values.check_path,
                                        example='"{shard_train.manifest}"')
    tasks: int = spec_field(1, doc="array tasks converting in parallel; a last job writes and "
                            "verifies the manifest", ge=1, le=MAX_TASKS)
    shard_size: int = spec_field(1024, doc="samples per shard", ge=1)
    encoding: Literal["jpeg", "raw"] = spec_field("jpeg", doc="jpeg: original bytes; raw: decoded")
    max_side: Optional[int] = spec_field(None, doc="jpeg: re-encode images larger than this", ge=1,
                                         example=500)
    quality: int = spec_field(90, doc="JPEG re-encode quality", ge=1, le=100)
    raw_size: int = spec_field(256, doc="raw: square side in pixels", ge=1)
    seed: int = spec_field(0, doc="sample order shuffle seed", ge=0)
    strict: bool = spec_field(False, doc="stop at the first unreadable image")
    verify: bool = spec_field(True, doc="`data verify` the split after its manifest is written")


@dataclass(frozen=True)
class SweepSpec:
    grid: dict[str, list[Any]] = spec_field(
        doc="job spec key -> values; every combination is a member", factory=dict,
        key_check=check_spec_key)
    sets: list[dict[str, Any]] = spec_field(
        doc="override sets (key -> value), each combined with every grid point", factory=list)
    parallelism: int = spec_field(1, doc="members running at once (the array's %N)", ge=1,
                                  le=MAX_TASKS)
    best_by: Optional[str] = spec_field(None, doc="the metric that picks {STAGE.best.run_dir}",
                                        check=check_metric, example="val.accuracy")
    best_mode: Optional[Literal["max", "min"]] = spec_field(
        None, doc="max or min of best_by; default min for a loss, else max")


@dataclass(frozen=True, kw_only=True)
class TrainStage(Stage):
    spec: str = spec_field(doc="job spec file", check=values.check_path, example="jobs/smoke.yaml")
    set: dict[str, Any] = spec_field(doc="job spec overrides, key -> value, as --set",
                                     factory=dict, key_check=check_spec_key)
    sweep: Optional[SweepSpec] = None     # built apart (load.py): a nested, optional section


@dataclass(frozen=True, kw_only=True)
class EvaluateStage(Stage):
    run_dir: str = spec_field(doc="the run to evaluate", check=values.check_path,
                              example='"{train.run_dir}"')
    checkpoint: Optional[int] = spec_field(None, doc="checkpoint step; default the latest", ge=0,
                                           example=1200)
    data: Optional[str] = spec_field(None, doc="shards to evaluate on; default the run's",
                                     check=values.check_path, example='"{shard_train.out}"')
    split: str = spec_field("val", doc="split to evaluate", check=values.check_run_name)


@dataclass(frozen=True, kw_only=True)
class ExportStage(Stage):
    run_dir: str = spec_field(doc="the run to export", check=values.check_path,
                              example='"{train.run_dir}"')
    output: Optional[str] = spec_field(None, doc="the file to write; default <workflow dir>/"
                                       "<stage>.pt", check=values.check_path,
                                       example='"{workflow.dir}/model.pt"')
    checkpoint: Optional[int] = spec_field(None, doc="checkpoint step; default the latest", ge=0,
                                           example=1200)
    format: Literal["state_dict", "torchscript"] = spec_field("state_dict", doc="file format")


@dataclass(frozen=True, kw_only=True)
class CommandStage(Stage):
    # Shell by design, like slurm.setup: a site's own step (copying data, say).
    run: str = spec_field(doc="a shell command; references are replaced by quoted values",
                          example='"rsync -a /archive/imagenet/ $TMPDIR/"')
    tasks: int = spec_field(1, doc="array tasks (each sees SLURM_ARRAY_TASK_ID)", ge=1,
                            le=MAX_TASKS)


KINDS: dict[str, type] = {"shard": ShardStage, "train": TrainStage, "evaluate": EvaluateStage,
                          "export": ExportStage, "command": CommandStage}


@dataclass(frozen=True)
class WorkflowHead:
    """The top level of a workflow file; `slurm` and `stages` are read apart (load.py)."""
    name: str = spec_field(doc="names the workflow directory <root>/<name>-<stamp>",
                           check=values.check_run_name, example="smoke-chain")
    root: str = spec_field("runs", doc="where workflow directories are made",
                           check=values.check_path)
    slurm: dict[str, Any] = spec_field(doc="defaults for every non-train stage's slurm section "
                                       "(spec.Resources; mem 4G unless given)", factory=dict)
    stages: dict[str, Any] = spec_field(doc="stage name -> stage", factory=dict)


@dataclass(frozen=True)
class Workflow:
    """A checked workflow: stages in file order, each with its merged resources."""
    name: str
    root: str
    stages: dict[str, Stage]
    slurm: dict[str, Resources]           # stage -> its job's resources (non-train stages)
    source: dict                          # the file's data with --set applied (for resume)
    warnings: list[Problem] = field(default_factory=list)   # old key names, say
