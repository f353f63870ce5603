"""The Python API on run directories built here (no Slurm, no ranks): open_run, status,
metrics, logs, wait's bound, the spec checks, and light imports."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import hpc_train
from hpc_train import events
from hpc_train.api.run import Run, is_final, open_run, wait_for
from hpc_train.api.specs import read_spec
from hpc_train.bench.inspect import make_run
from hpc_train.errors import HpcTrainError, InspectError, SpecError, UsageError, WaitTimeout
from hpc_train.inspection.summary import RunStatus
from hpc_train.rundir import RunPaths, append_jsonl
from hpc_train.spec import SpecInvalid, load_spec
from tests.conftest import REPO

HEAVY = ("torch", "horovod", "h5py", "deepspeed", "mpi4py")


def test_import_and_api_names_load_no_heavy_library():
    code = ("import sys, hpc_train; hpc_train.open_run; hpc_train.submit; hpc_train.Run; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_package_names_the_api_and_still_imports_submodules():
    assert hpc_train.open_run is open_run and hpc_train.Run is Run
    assert {"submit", "open_run", "resume"} <= set(dir(hpc_train))
    with pytest.raises(AttributeError, match="no_such_name"):
        hpc_train.no_such_name
    from hpc_train import rundir   # a submodule, not an API name
    assert rundir.RunPaths is RunPaths


@pytest.fixture
def finished(tmp_path):
    """make_run's finished run (job 42, requeued once) of 2 ranks and 40 logged steps."""
    return make_run(tmp_path, ranks=2, metric_lines=40, every=10)


def test_open_run_by_path_and_by_job_id(finished, tmp_path):
    by_path = open_run(finished.root)
    by_job = open_run("42", root=tmp_path)
    assert by_path == by_job and by_job.path == finished.root.resolve()
    assert by_path.job_id == "42" and by_path.executor == "slurm"
    assert repr(by_path) == f"<Run bench-inspect job 42 (slurm) at {finished.root.resolve()}>"
    with pytest.raises(InspectError, match="job 43: no run under"):
        open_run("43", root=tmp_path)
    with pytest.raises(InspectError, match="neither a run directory nor a job id"):
        open_run(tmp_path / "missing")


def _timeless(status: dict) -> dict:
    """A status without what moves with the clock."""
    health = {k: v for k, v in status["health"].items() if k != "idle_seconds"}
    return {**status, "health": health, "updated": None, "checkpoint_age_seconds": None}


def test_status_is_what_status_json_prints(finished):
    status = open_run(finished.root).status(slurm=False)
    assert isinstance(status, RunStatus)
    assert status.state == "COMPLETED" and status.state_source == "events"
    assert status.step == 400 and status.requeues == 1 and status.checkpoint_step == 400
    out = subprocess.run([sys.executable, "-m", "hpc_train", "status", str(finished.root), "--json",
                          "--no-slurm"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert _timeless(status.to_json()) == _timeless(json.loads(out.stdout)["runs"][0])


def test_metrics_in_order_and_by_split(finished):
    append_jsonl(finished.metrics, {"time": 2e9, "step": 400, "split": "val", "accuracy": 0.5})
    run = open_run(finished.root)
    everything = run.metrics()
    assert len(everything) == 41 and [m["step"] for m in run.metrics("train")] == list(range(10, 401, 10))
    assert run.metrics("val") == [everything[-1]]


def test_logs_of_one_rank_and_of_all(finished):
    run = open_run(finished.root)
    rank0 = run.logs(0)
    assert "step 400/400" in rank0 and not rank0.startswith("[rank")
    merged = run.logs(None).splitlines()
    assert {line.split("]")[0] for line in merged} == {"[rank 0", "[rank 1"}
    assert run.logs(1, grep="done").count("\n") == 1
    assert "step 10/400" not in run.logs(0, run=-1)      # the second start only
    with pytest.raises(InspectError, match=r"no log for rank\(s\) \[5\]"):
        run.logs(5)


@pytest.mark.parametrize("source, state, final", [
    ("events", "PENDING", False), ("events", "RUNNING", False), ("events", "UNKNOWN", False),
    ("events", "COMPLETED", True), ("events", "STOPPED", True), ("events", "FAILED", True),
    ("squeue", "PENDING", False), ("squeue", "REQUEUED", False), ("squeue", "COMPLETING", False),
    ("squeue", "STOPPED", False),      # Slurm's STOPPED: the job is held, not over
    ("sacct", "CANCELLED", True), ("sacct", "TIMEOUT", True), ("sacct", "COMPLETED", True),
    ("squeue", "UNKNOWN (WEIRD: a state this hpc_train does not know)", False),
])
def test_is_final(finished, source, state, final):
    base = open_run(finished.root).status(slurm=False)
    assert is_final(dataclasses.replace(base, state=state, state_source=source)) is final


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_returns_the_first_final_status(finished):
    base = open_run(finished.root).status(slurm=False)
    states = iter(["PENDING", "RUNNING", "RUNNING", "COMPLETED"])
    clock = FakeClock()
    final = wait_for(lambda: dataclasses.replace(base, state=next(states), state_source="squeue"),
                     timeout=60, poll=5, clock=clock, sleep=clock.sleep)
    assert final.state == "COMPLETED" and clock.now == 15


def test_wait_is_bounded_and_says_how_far_it_got(finished):
    base = open_run(finished.root).status(slurm=False)
    running = dataclasses.replace(base, state="RUNNING", state_source="squeue")
    looks, clock = [], FakeClock()

    def look():
        looks.append(clock.now)
        return running

    with pytest.raises(WaitTimeout, match=r"job 42\) is still RUNNING after 12 s; it goes on") as caught:
        wait_for(look, timeout=12, poll=5, clock=clock, sleep=clock.sleep)
    assert looks == [0, 5, 10, 12]             # one last look at the deadline
    assert caught.value.status is running
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, HpcTrainError)


def test_wait_on_an_ended_run_returns_at_once(finished):
    assert open_run(finished.root).wait(timeout=0, slurm=False).state == "COMPLETED"


def test_cancel_refuses_what_it_cannot_reach(tmp_path):
    paths = RunPaths(tmp_path / "local-run")
    paths.make_dirs()
    with pytest.raises(UsageError, match="no submission recorded"):
        Run(paths.root).cancel()
    append_jsonl(paths.events, events.stamped(events.submitted("4242", "local", "h"), environ={}))
    with pytest.raises(UsageError, match=r"local executor from another process \(pid 4242\)"):
        open_run(paths.root).cancel()


def test_submit_refuses_a_bad_spec_with_its_problems_and_creates_nothing(tmp_path):
    data = {"run": {"name": "bad", "root": str(tmp_path / "runs")}, "optim": {"base_lr": -1}}
    with pytest.raises(SpecInvalid) as caught:
        hpc_train.submit(data, ["data.batch_size=0"], ask_slurm=False)
    keys = {p.key for p in caught.value.problems}
    assert keys == {"optim.base_lr", "data.batch_size (from --set)"} and caught.value.exit_code == 2
    with pytest.raises(SpecInvalid, match="data.batch_size"):
        hpc_train.submit(REPO / "jobs/smoke.yaml", [f"run.root={tmp_path}/runs", "data.batch_size=x"])
    with pytest.raises(SpecInvalid, match="a spec is a YAML file's path, a dict of sections or a JobSpec"):
        hpc_train.submit(["not", "a", "spec"])
    assert not (tmp_path / "runs").exists()


def test_a_spec_reads_the_same_from_a_file_a_dict_and_a_jobspec():
    overrides = ["optim.base_lr=0.2", "slurm.nodes=1-2"]
    from_file, _ = read_spec(REPO / "jobs/smoke.yaml", overrides)
    assert from_file == load_spec(REPO / "jobs/smoke.yaml", overrides)
    assert read_spec(dataclasses.asdict(from_file))[0] == from_file
    assert read_spec(load_spec(REPO / "jobs/smoke.yaml"), overrides)[0] == from_file


def test_resume_of_a_directory_that_is_no_run(tmp_path):
    with pytest.raises(SpecError, match="is not a run directory"):
        hpc_train.resume(tmp_path)
