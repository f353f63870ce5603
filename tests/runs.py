"""Helpers for end-to-end tests: submit through the real CLI and read a run directory."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.runtime.heartbeat import read_beats
from tests.conftest import REPO


# The data workers' path (a forkserver per rank, which imports torch again, and the decoding handed
# over to worker processes) is tested end to end where it is the subject or the shipped path as a
# user runs it: test_lifecycle_e2e (the smoke job stopped three ways), test_submit_e2e,
# test_user_code_e2e, test_resize_e2e, tests/train/test_resume_exact.py, test_data_workers. The
# other end-to-end jobs are about requeue, preemption, restarts or nodes: they load in the rank.
# CI is CPU-bound, and a 2-epoch smoke run costs about 4 core-seconds less so (25.7 -> 21.5,
# measured on the whole machine; docs/testing.md).
NO_WORKERS = "data.workers=0"
# One epoch of jobs/smoke.yaml (3,000 demo images at 64 per step, the tail dropped): for the
# end-to-end jobs whose assertions read no second epoch.
ONE_EPOCH, SMOKE_EPOCH_STEPS = "optim.epochs=1", 46


def cli(*args: str, env=None, timeout: float = 600, cwd=REPO) -> subprocess.CompletedProcess:
    """`python -m hpc_train ARGS`. The timeout only catches a hang: in CI's three lanes on two
    cores, a submit of a DeepSpeed spec (its config checked against DeepSpeed's own keys, an
    import of 3 s of CPU) beside four other submits took over 120 s (CI12)."""
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


SLURM_COMMANDS = ("sbatch", "srun", "salloc", "squeue", "sinfo", "sacct", "scontrol", "scancel")


def path_without(bin_dir: Path, tools: tuple[str, ...] = SLURM_COMMANDS,
                 replacements: dict[str, str] | None = None) -> str:
    """A PATH like this one minus `tools` (a login node without Slurm, say), built as a folder
    of symlinks; `replacements` adds scripts of our own under those names."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, script in (replacements or {}).items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    for directory in os.environ["PATH"].split(os.pathsep):
        if not Path(directory).is_dir():
            continue
        for tool in Path(directory).iterdir():
            target = bin_dir / tool.name
            if tool.name not in tools and not target.exists() and not target.is_symlink():
                target.symlink_to(tool)
    return str(bin_dir)


def submit(spec_file: str, root: Path, *overrides: str, env=None) -> tuple[str, RunPaths]:
    """`python -m hpc_train submit` -> (job id, run paths); fails the test on a non-zero exit."""
    args = ["submit", spec_file, "--set", f"run.root={root}"]
    for override in overrides:
        args += ["--set", override]
    out = cli(*args, env=env)
    assert out.returncode == 0, out.stderr
    job_id = re.search(r"^job id:\s+(\S+)$", out.stdout, re.M).group(1)
    run_dir = re.search(r"^run dir:\s+(.+)$", out.stdout, re.M).group(1)
    return job_id, RunPaths(Path(run_dir))


def run_dirs(root: Path) -> list[Path]:
    """The run directories under a run root (not its hidden `.code` snapshot cache)."""
    return sorted(p for p in Path(root).iterdir() if not p.name.startswith("."))


def driver_argv(line: str) -> list[str]:
    """A script's driver line as the words of the Python command it runs: `exec` and, for a run
    with a code snapshot, `env` and its assignments taken off."""
    import shlex

    words = shlex.split(line)
    assert words[0] == "exec", line
    words = words[1:]
    if words[0] == "env":
        words = [w for w in words[1:] if not re.match(r"[A-Z_]+=", w)]
    return words


def events(paths: RunPaths, name: str | None = None) -> list[dict]:
    return [e for e in read_jsonl(paths.events) if name is None or e["event"] == name]


def train_losses(paths: RunPaths) -> list[float]:
    return [m["loss"] for m in read_jsonl(paths.metrics) if m.get("split") != "val"]


def assert_trained(paths: RunPaths, ranks: int = 2, loss_factor: float = 0.5) -> None:
    """The run-directory contract of a finished data-parallel run, and a run that learned."""
    for path in (paths.spec, paths.events, paths.metrics):
        assert path.is_file(), path
    for rank in range(ranks):
        log = paths.rank_log(rank)
        assert log.is_file() and f"rank {rank} done" in log.read_text(), log
    finished = events(paths, "rank_finished")
    assert {e["rank"] for e in finished} == set(range(ranks))
    assert len({e["params_sha256"] for e in finished}) == 1, "replicas ended with different weights"
    losses = train_losses(paths)
    assert len(losses) >= 2 and losses[-1] < loss_factor * losses[0], losses
    assert events(paths, "finished")[-1]["status"] == "completed"


def describe_failure(paths: RunPaths, lines: int = 15) -> str:
    """The tails of the driver's and every rank's log: what a failed assertion should show."""
    parts = []
    for log in [*sorted(paths.submitit.glob("*.err")), *sorted(paths.root.glob("slurm-*.out")),
                *sorted(paths.logs.glob("rank-*.log")), *sorted(paths.logs.glob("node-*.log"))]:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log}\n" + "\n".join(tail))
    return "\n".join(parts) or f"no logs under {paths.root}"


def local_run(root: Path, *overrides: str, name: str = "local", spec_file: str = "jobs/smoke.yaml") -> RunPaths:
    """A run directory prepared as `submit` would, for driving the ranks without Slurm."""
    from hpc_train.spec import dump_spec_yaml, load_spec
    from hpc_train.spec.paths import resolve_paths

    spec = resolve_paths(load_spec(REPO / spec_file, [f"run.name={name}", *overrides]), REPO)
    paths = RunPaths.new(root, spec.run.name)
    paths.spec.write_text(dump_spec_yaml(spec))
    return paths


def logged_step(paths: RunPaths, since: float = 0.0) -> int:
    """The last training step rank 0 logged at or after `since` (-1: none yet)."""
    steps = [m["step"] for m in read_jsonl(paths.metrics)
             if m.get("split") is None and m.get("time", 0) >= since]
    return steps[-1] if steps else -1


def rank_beat(paths: RunPaths, rank: int) -> dict:
    """A rank's last beat as the run directory has it (its node's file, or an old rank file):
    rank, step, phase, progress, time, pid, host, times; KeyError while it has none."""
    return dataclasses.asdict(read_beats(paths.heartbeat)[rank])


def known_beat(paths: RunPaths, rank: int) -> dict | None:
    """`rank_beat`, or None while the run directory has none: a rank that starts after its
    node's writer wrote the node's file appears in it at the next write, an interval later."""
    try:
        return rank_beat(paths, rank)
    except KeyError:
        return None


def await_beat(paths: RunPaths, rank: int, timeout: float = 60) -> dict:
    """`rank_beat`, once the run directory has one."""
    return wait_for(lambda: known_beat(paths, rank), timeout, f"rank {rank}'s beat in {paths.heartbeat}")


def heartbeat_step(paths: RunPaths, rank: int = 0) -> int:
    """How far the run is: the later of rank 0's last logged step and `rank`'s heartbeat (which
    a thread rewrites every few seconds, so it may lag a fast run); -1 before either exists."""
    logged = [m["step"] for m in read_jsonl(paths.metrics) if m.get("split") is None and "step" in m]
    beat = (known_beat(paths, rank) or {"step": -1})["step"]
    return max([beat, *logged[-1:]])


def drive(paths: RunPaths, signal_at_step: int | None = None, signum: int = 0, timeout: float = 900,
          env=None, signal_when=None) -> int:
    """Run the driver here (as a rendered script's `exec` would, minus Slurm); optionally send it
    `signum` once rank 0 reports step >= signal_at_step, or once `signal_when()` is true.
    Returns the driver's exit status."""
    import signal as signals
    import time

    environ = {k: v for k, v in (env or os.environ).items()
               if not k.startswith(("SLURM_", "SUBMITIT_"))}
    # The driver's output goes where submitit would keep it under Slurm (mpirun's reports too).
    paths.submitit.mkdir(parents=True, exist_ok=True)
    with open(paths.submitit / "local_0_log.err", "ab") as output:
        process = subprocess.Popen([sys.executable, "-m", "hpc_train.job.driver", str(paths.root)],
                                   cwd=REPO, env=environ, stdout=output, stderr=subprocess.STDOUT)
    if signal_at_step is not None:
        signal_when = lambda: heartbeat_step(paths) >= signal_at_step   # noqa: E731
    deadline = time.monotonic() + timeout
    sent = signal_when is None
    while process.poll() is None and time.monotonic() < deadline:
        if not sent and signal_when():
            process.send_signal(signum or signals.SIGUSR2)
            sent = True
        time.sleep(0.05)
    if process.poll() is None:
        process.kill()
        raise AssertionError(f"driver still running after {timeout} s\n{describe_failure(paths)}")
    assert sent, f"the run ended before it was signalled (step {signal_at_step} or signal_when)"
    return process.returncode


def rank_results(out_dir: Path, ranks: int) -> list[dict]:
    """The rank-N.json files an mpirun worker wrote, in rank order; all `ranks` must be there."""
    results = [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank-*.json"))]
    results.sort(key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == list(range(ranks)), results
    return results


def schema_problems(document, schema: dict) -> list[str]:
    """Where `document` breaks the JSON schema `schema` (draft 2020-12); [] when it conforms."""
    from jsonschema import Draft202012Validator

    return [f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}"
            for e in Draft202012Validator(schema).iter_errors(document)]


def check_golden(name: str, text: str) -> None:
    """`text` equals tests/golden/NAME; UPDATE_GOLDEN=1 rewrites the file after a deliberate change."""
    path = REPO / "tests" / "golden" / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def assert_identical(a, b, path="state"):
    """Nested dicts/lists of tensors and plain values are equal, tensors bit for bit."""
    import torch

    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_identical(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def metrics_after(paths: RunPaths, since: float) -> list[dict]:
    """The training metric lines rank 0 wrote after `since`."""
    return [m for m in read_jsonl(paths.metrics) if m.get("split") is None and m["time"] > since]


def final_checkpoint(paths: RunPaths, rank: int, step: int):
    """(the replicated state, rank `rank`'s own state) of the checkpoint of `step`."""
    import torch

    from hpc_train.checkpoint import layout

    directory = paths.checkpoints / layout.step_dir_name(step)
    return (torch.load(directory / layout.REPLICATED, weights_only=True),
            torch.load(directory / layout.rank_file_name(rank), weights_only=True))


def layout_step(paths: RunPaths, step: int) -> Path:
    from hpc_train.checkpoint import layout

    return paths.checkpoints / layout.step_dir_name(step)


def sharded_tensors(directory: Path) -> dict:
    """Every tensor of a checkpoint's sharded part by where it is, read with the library that
    wrote it (meta.json "sharded"): the whole model and optimizer from DCP's shards, or each
    DeepSpeed file's tensors (each rank's own partition); {} for a replicated checkpoint."""
    import torch

    from hpc_train.checkpoint import layout
    from hpc_train.checkpoint.sharded import whole_state

    written_by = json.loads((directory / layout.META).read_text()).get("sharded")
    if written_by is None:
        return {}
    if written_by == "dcp":
        return whole_state(directory / layout.SHARDED)
    found = {}

    def walk(value, where):
        if isinstance(value, torch.Tensor):
            found[where] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}")
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")

    for path in sorted((directory / layout.SHARDED).rglob("*.pt")):
        # DeepSpeed's files hold its own objects besides tensors: files this test's runs wrote.
        walk(torch.load(path, map_location="cpu", weights_only=False), path.name)
    assert found, f"{directory}: no tensor in its DeepSpeed files"
    return found


def assert_same_training(paths: RunPaths, straight: RunPaths, total_steps: int, ranks: int = 2) -> None:
    """A run interrupted and resumed ended as the uninterrupted `straight` one: the same steps,
    every rank's parameters, optimizer and buffers bit-identical (a sharded run's every shard),
    and the loss of every step trained (again) after a resume the uninterrupted run's at that step."""
    import pytest

    for run in (paths, straight):
        finished = events(run, "rank_finished")
        assert sorted(e["rank"] for e in finished[-ranks:]) == list(range(ranks))
        assert {e["step"] for e in finished} == {total_steps}
    assert ({e["params_sha256"] for e in events(paths, "rank_finished")}
            == {e["params_sha256"] for e in events(straight, "rank_finished")})
    for rank in range(ranks):
        expected, got = final_checkpoint(straight, rank, total_steps), final_checkpoint(paths, rank, total_steps)
        for key in ("model", "optimizer", "precision"):   # a sharded run has its model in its shards
            if key in expected[0] or key in got[0]:
                assert_identical(expected[0][key], got[0][key], key)
        assert_identical(expected[1]["buffers"], got[1]["buffers"], f"rank {rank} buffers")
    final = layout_step(paths, total_steps), layout_step(straight, total_steps)
    assert_identical(sharded_tensors(final[1]), sharded_tensors(final[0]), "sharded")
    expected = {m["step"]: m["loss"] for m in metrics_after(straight, 0)}
    logged = metrics_after(paths, 0)
    assert {m["step"] for m in logged} == set(expected)
    for m in logged:
        assert m["loss"] == pytest.approx(expected[m["step"]], rel=1e-6, abs=1e-7), m["step"]


BAD_SPECS = sorted((REPO / "tests" / "specs_bad").glob("*.yaml"))


def wait_for(predicate, timeout: float, what: str):
    """Poll `predicate` until it returns something true, and return that; fail after `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# A tiny synthetic image run: quick to build a model of, and to evaluate.
SYNTHETIC_RUN = ("data.kind=synthetic", "data.train_samples=128", "data.val_samples=60",
                 "data.image_size=16", "data.workers=0", "data.batch_size=16")


def checkpointed_run(root: Path, *overrides: str, name: str = "saved", steps=(8,),
                     world_size: int = 2) -> RunPaths:
    """A run directory with complete checkpoints of a freshly built model (no training) in the
    on-disk layout the trainer writes, each rank with BatchNorm statistics of its own: for the
    code that reads checkpoints (evaluate, export)."""
    import torch

    from hpc_train.checkpoint import layout
    from hpc_train.models import build_model
    from hpc_train.spec import load_spec, spec_hash

    paths = local_run(root, *SYNTHETIC_RUN, *overrides, name=name)
    paths.make_dirs()
    spec = load_spec(paths.spec)
    torch.manual_seed(0)
    model = build_model(spec.model.name, spec.data.num_classes, spec.model.options)
    for step in steps:
        directory = paths.checkpoints / layout.step_dir_name(step)
        directory.mkdir()
        torch.save({"model": model.state_dict(), "spec": {}}, directory / layout.REPLICATED)
        for rank in range(world_size):
            buffers = {name: (value + 0.1 * rank * torch.rand_like(value.float())).to(value.dtype)
                       if rank and value.is_floating_point() else value.clone()
                       for name, value in model.named_buffers()}
            torch.save({"buffers": buffers, "rank": rank}, directory / layout.rank_file_name(rank))
        (directory / layout.META).write_text(json.dumps(
            {"step": step, "world_size": world_size, "spec_hash": spec_hash(spec)}))
        (directory / layout.MARKER).write_text(f"{step}\n")
    return paths
