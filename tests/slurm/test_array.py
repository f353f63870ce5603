"""A sweep as one job array: the --array value, the driver line and logs per member, the
`<array>_<task>` name a member uses for itself (events, requeue)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpc_train import events, scheduler
from hpc_train.errors import SpecError
from hpc_train.slurm.array import (array_driver_command, array_range, member_dir, member_outputs,
                                   new_prefix, planned_array_script)
from hpc_train.spec import load_spec
from tests.conftest import REPO

PYTHON = "/opt/venv/bin/python"


def test_array_range_names_every_member_or_some():
    assert array_range([0, 1, 2, 3], 2) == "0-3%2"
    assert array_range([3, 1], 2) == "1,3%2"
    assert array_range([0, 1, 3, 5, 6], 8) == "0-1,3,5-6%5"     # %N never above the tasks
    with pytest.raises(ValueError):
        array_range([], 1)


def test_the_driver_line_picks_the_members_directory_in_the_shell(tmp_path):
    prefix = Path("/runs/it's odd $(x)/smoke-20260101-000000")
    line = array_driver_command(PYTHON, prefix)
    assert line.startswith(f"exec {PYTHON} -m hpc_train.job.driver ")
    # What bash makes of it for task 3: the member's directory, nothing run.
    out = subprocess.run(["bash", "-c", line.replace("exec ", "printf %s ", 1).replace(
        f"{PYTHON} -m hpc_train.job.driver ", "", 1)], env={"SLURM_ARRAY_TASK_ID": "3"},
        capture_output=True, text=True)
    assert out.stdout == str(member_dir(prefix, 3))


def test_each_member_logs_into_its_own_run_directory():
    outputs = member_outputs(Path("/runs/100%/smoke-1"))
    assert outputs["output"] == "/runs/100%%/smoke-1-m%a/submitit/%A_%a_0_log.out"
    assert outputs["error"].endswith("-m%a/submitit/%A_%a_0_log.err")


def test_new_prefix_makes_every_member_directory(tmp_path):
    from datetime import datetime

    now = datetime(2026, 1, 1)
    first = new_prefix(tmp_path, "smoke", 3, now)
    second = new_prefix(tmp_path, "smoke", 3, now)
    assert first.name == "smoke-20260101-000000" and second.name == "smoke-20260101-000000-2"
    assert all((member_dir(first, k) / "checkpoints").is_dir() for k in range(3))


def test_the_array_script_has_one_set_of_options(tmp_path):
    specs = {k: load_spec(REPO / "jobs/smoke.yaml", [f"optim.base_lr={lr}"])
             for k, lr in enumerate((0.1, 0.2, 0.4))}
    script = planned_array_script(specs, tmp_path / "smoke-1", 2, PYTHON,
                                  {"dependency": "afterok:7", "kill-on-invalid-dep": "yes"})
    lines = script.splitlines()
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --dependency=afterok:7", "#SBATCH --requeue",
                 "#SBATCH --kill-on-invalid-dep=yes", f"#SBATCH --output={tmp_path}/smoke-1-m%a/"
                 "submitit/%A_%a_0_log.out"):
        assert line in lines, line
    assert lines[-1] == array_driver_command(PYTHON, tmp_path / "smoke-1")
    specs[2] = load_spec(REPO / "jobs/smoke.yaml", ["slurm.time=00:20:00"])
    with pytest.raises(SpecError, match="sweep member 2: sbatch options time differ"):
        planned_array_script(specs, tmp_path / "smoke-1", 2, PYTHON)


def test_an_array_task_names_itself_array_underscore_task():
    task = {"SLURM_JOB_ID": "131", "SLURM_ARRAY_JOB_ID": "128", "SLURM_ARRAY_TASK_ID": "3"}
    assert scheduler.job_ref(task) == "128_3"
    assert scheduler.job_ref({"SLURM_JOB_ID": "131"}) == "131"
    assert scheduler.job_ref({}) is None
    assert events.stamped({"event": "started"}, task, now=1.0)["job_id"] == "128_3"


def test_the_driver_requeues_its_own_task_not_the_array(monkeypatch, tmp_path):
    from hpc_train.job import driver
    from hpc_train.job.requeue import Decision
    from hpc_train.rundir import RunPaths

    asked = []
    monkeypatch.setattr(scheduler, "show_job", lambda job: asked.append(("show", job)) or None)
    monkeypatch.setattr(scheduler, "requeue", lambda job, restart: asked.append(("requeue", job))
                        or ("driver", "ok"))
    paths = RunPaths(tmp_path)
    environ = {"SLURM_JOB_ID": "128", "SLURM_ARRAY_JOB_ID": "128", "SLURM_ARRAY_TASK_ID": "3"}
    done = driver._carry_out(Decision("requeue", "stop", events.CAUSE_STOP), paths, environ, 0, None,
                             driver.Ended(0, 1.0))
    assert done.action == "requeue"
    assert asked == [("show", "128_3"), ("requeue", "128_3")]
