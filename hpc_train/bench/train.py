"""`bench train [SPEC]`: the spec's model under each configuration of a matrix (backend: ddp,
horovod, fsdp, zero1-3; precision, compression, ranks, accumulation, synthetic or the spec's own
data), through the driver's launcher and the real Trainer, against a bare PyTorch loop, with the
gradient allreduce of Horovod and DDP against raw MPI, measured in the same run; each row with
the state its ranks hold and its bytes on the wire per step.

From a login node, `--submit` sends the whole benchmark as one Slurm job shaped by the spec
(nodes, tasks, GPUs, partition, setup lines) and prints where its report will be; inside an
allocation it runs directly, and outside any it runs on this host (mpirun). Everything goes to
a bench directory under the spec's run.root: bench-<name>-<stamp>/ with spec.yaml, plan.json,
configs/<name>/ (each configuration's spec and the trainer's own metrics), logs/, results/ and
report.json, report.md, report.png.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from hpc_train.argtypes import print_result, print_warnings
from hpc_train.bench import train_plan, train_report
from hpc_train.bench.ranks import run_ranks
from hpc_train.bench.train_rank import LAUNCH_ENV
from hpc_train.errors import HpcTrainError, LaunchError
from hpc_train.job.driver import current_allocation
from hpc_train.launch.allocation import Allocation
from hpc_train.rundir import RunPaths
from hpc_train.train.timing import Stopwatch

DEFAULT_SPEC = "jobs/smoke.yaml"
PLAN, REPORT_JSON, REPORT_MD, REPORT_PNG, OUTPUT = ("plan.json", "report.json", "report.md",
                                                   "report.png", "bench.out")
CHUNK = 5   # steps of a trainer, then of its bare baseline, in turn: both see the same load
RANK_MODULE = "hpc_train.bench.train_rank"


def matrix_from(args) -> train_plan.Matrix:
    """The default matrix with each list option given on the command line instead."""
    d, tp = train_plan.Matrix(), train_plan

    def given(text, allowed, option, default):
        return tp.parse_list(text, allowed, option) if text else default

    def counts(text, option, default):
        return tp.parse_counts(text, option) if text else default

    return tp.Matrix(backends=given(args.backends, tp.BACKENDS, "--backends", d.backends),
                     precisions=given(args.precisions, tp.PRECISIONS, "--precisions", d.precisions),
                     compressions=given(args.compressions, tp.COMPRESSIONS, "--compressions",
                                        d.compressions),
                     ranks=counts(args.ranks, "--ranks", d.ranks),
                     accumulations=counts(args.accumulation, "--accumulation", d.accumulations),
                     data=given(args.data, tp.DATA_KINDS, "--data", d.data), bare=not args.no_bare)


def load_bench_spec(spec_file: str, overrides: list[str]):
    """The checked spec (warnings to stderr) with absolute paths; pipeline stages are refused
    (a gpt of one stage is data parallelism of its block list, and is measured)."""
    from hpc_train.spec import validate_spec_file
    from hpc_train.spec.paths import resolve_paths

    spec, warnings = validate_spec_file(spec_file, overrides)
    print_warnings(warnings)
    if spec.uses_pipeline:
        raise HpcTrainError("bench train measures data-parallel and sharded models; for pipeline "
                            "stages use `python -m hpc_train bench pipeline`")
    return resolve_paths(spec)


def spec_data(spec) -> train_plan.SpecData:
    from hpc_train.spec.schema import TOKEN_KINDS, TaskKind

    # A causal LM reads token sequences whatever its data kind (a user's dataset of them too).
    text = spec.data.kind in TOKEN_KINDS or spec.task_kind is TaskKind.CAUSAL_LM
    return train_plan.SpecData(real=spec.data.kind != "synthetic" and not text, text=text,
                               dataset=spec.data.kind == "dataset")


def plan_configs(args, spec) -> list[train_plan.Config]:
    """The matrix's configurations whose spec is valid; one line to stderr for each left out
    (DeepSpeed not installed, or a combination a spec rule refuses: fp16 with DeepSpeed,
    compression or accumulation with a gpt's data-parallel block list), with the rule's words."""
    from hpc_train.parallel.deepspeed_config import installed
    from hpc_train.spec import SpecInvalid, load_spec

    configs, skipped = train_plan.configurations(matrix_from(args), spec.world_size, spec_data(spec),
                                                 deepspeed=installed())
    for line in skipped:
        print(line, file=sys.stderr)
    kept = []
    for config in configs:
        try:
            load_spec(args.spec or DEFAULT_SPEC, [*args.overrides, *config_overrides(config, spec, args)])
        except SpecInvalid as refused:
            print(f"bench train: {config.name} left out: {refused.problems[0]}", file=sys.stderr)
            continue
        kept.append(config)
    if not kept:
        raise HpcTrainError("bench train: no configuration of the matrix is valid for this spec "
                            "(see the lines above)")
    return kept


def config_overrides(config: train_plan.Config, spec, args) -> list[str]:
    return train_plan.config_overrides(config, spec.world_size, spec.data.batch_size,
                                       args.warmup + args.steps)


def make_plan(args, spec, spec_file: str, configs: list[train_plan.Config]) -> dict:
    launches = train_plan.launches(configs, args.rounds)
    if not args.no_allreduce and spec.world_size > 1:
        last_full = max(i for i, launch in enumerate(launches) if launch["ranks"] == spec.world_size)
        launches[last_full]["allreduce"] = True
    text = spec_data(spec).text
    return {"settings": {"spec": spec_file, "model": spec.model.name, "batch_size": spec.data.batch_size,
                         "image_size": spec.data.image_size, "world_size": spec.world_size,
                         "sample": "sequence" if text else "image",
                         "seq_len": spec.data.seq_len if text and spec.data.kind != "dataset" else None,
                         "hosts": spec.slurm.nodes, "launcher": spec.launch.method,
                         "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds,
                         "command": "python -m hpc_train " + shlex.join(sys.argv[1:])},
            "warmup": args.warmup, "steps": args.steps, "chunk": CHUNK, "gpu": spec.uses_gpu,
            "allreduce": {"model": args.allreduce_model, "repetitions": args.allreduce_repetitions,
                          "rounds": args.allreduce_rounds},
            "configs": [c.as_dict() for c in configs], "launches": launches}


def prepare(args) -> Path:
    """A new bench directory holding the spec, the plan and every configuration's spec."""
    from hpc_train.spec import dump_spec_yaml, load_spec

    spec_file = args.spec or DEFAULT_SPEC
    spec = load_bench_spec(spec_file, args.overrides)
    configs = plan_configs(args, spec)
    plan = make_plan(args, spec, spec_file, configs)
    paths = RunPaths.new(spec.run.root, f"bench-{spec.run.name}")
    paths.spec.write_text(dump_spec_yaml(spec))
    for config in configs:
        overrides = config_overrides(config, spec, args)
        config_paths = RunPaths(paths.root / "configs" / config.name)
        config_paths.root.mkdir(parents=True)
        config_paths.spec.write_text(dump_spec_yaml(load_spec(paths.spec, overrides)))
    (paths.root / PLAN).write_text(json.dumps(plan, indent=1))
    return paths.root


def submit_job(root: Path, time_limit: str) -> str:
    from hpc_train import scheduler
    from hpc_train.slurm import batch
    from hpc_train.slurm.options import JobShape, sbatch_options, setup_lines
    from hpc_train.spec import load_spec

    spec = load_spec(RunPaths(root).spec)
    s = spec.slurm     # no stop signal in the shape: the benchmark neither checkpoints nor requeues
    shape = JobShape(f"bench-{spec.run.name}", str(root / OUTPUT), s.nodes, s.tasks_per_node)
    options = {**sbatch_options(s, shape), "time": time_limit}
    script = root / "bench.sbatch"
    command = [sys.executable, "-m", "hpc_train", "bench", "train", "--in-run", str(root)]
    script.write_text(batch.script_text(command, setup_lines(s),
                                        "Written by `python -m hpc_train bench train --submit`."))
    return scheduler.submit(batch.sbatch_args(options, script), "the benchmark's job")


def run_launches(spec, root: Path, plan: dict) -> None:
    """Every launch of the plan in its order, each started and supervised as a job's ranks (in
    this allocation, or on this host); stops at the first that fails, naming the logs. A launch
    of one rank (the plan has 1 and the whole allocation) runs on the allocation's first slot."""
    (allocation, _), paths = current_allocation(spec, os.environ), RunPaths(root)
    first_slot = Allocation(((allocation.host_names[0], 1),))
    for launch in plan["launches"]:
        slots = allocation if launch["ranks"] == allocation.world_size else first_slot
        ended = run_ranks(spec, paths, slots, RANK_MODULE, {LAUNCH_ENV: str(launch["id"])})
        if ended.failure:
            raise LaunchError(f"bench train: launch {launch['id']} ({launch['ranks']} rank(s)) "
                              f"failed ({ended.failure}); see {paths.logs}/rank-*.log")
        print(f"bench train: launch {launch['id'] + 1}/{len(plan['launches'])} done in "
              f"{ended.seconds:.0f} s", file=sys.stderr, flush=True)


def run_prepared(root: Path) -> dict:
    """Run every launch of the plan here; the report."""
    from hpc_train.spec import load_spec

    plan = json.loads((root / PLAN).read_text())
    spec = load_spec(RunPaths(root).spec)
    watch = Stopwatch()
    run_launches(spec, root, plan)
    results = [json.loads(p.read_text()) for p in sorted((root / "results").glob("launch-*/rank-*.json"))]
    report = train_report.build(plan, results)
    report["settings"]["seconds"] = round(watch.seconds(), 1)
    (root / REPORT_JSON).write_text(json.dumps(report, indent=1))
    (root / REPORT_MD).write_text(train_report.markdown(report))
    train_report.save_png(report, root / REPORT_PNG)
    return report


def main(args) -> int:
    if args.gpu_protocol:
        from hpc_train.bench import gpu

        return gpu.main(gpu.default_args())
    root = Path(args.in_run).resolve() if args.in_run else prepare(args)
    if args.submit:
        try:
            job_id = submit_job(root, args.time)
        except HpcTrainError:
            shutil.rmtree(root, ignore_errors=True)   # nothing submitted: leave nothing behind
            raise
        print(f"job id:    {job_id}")
        print(f"bench dir: {root}")
        print(f"report:    {root / REPORT_MD} (and {REPORT_JSON}, {REPORT_PNG}) when the job ends; "
              f"its output: {root / OUTPUT}")
        return 0
    report = run_prepared(root)
    # A job's output file, a pipe: Markdown, as docs/benchmarks.md records it.
    print_result(args.json, json.dumps(report, indent=1), lambda: train_report.print_table(report),
                 lambda: train_report.markdown(report))
    print(f"report: {root / REPORT_MD}, {root / REPORT_JSON}, {root / REPORT_PNG}", file=sys.stderr)
    return 0
