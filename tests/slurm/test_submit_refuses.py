"""Every wrong spec is refused by `submit` with exit 2, and nothing reaches sbatch.

The corpus is checked in process (`cli.main`, as `python -m hpc_train` calls it: the same
parsing, checks and exit status, without starting an interpreter 130 times); one spec also
goes through a real `python -m hpc_train` process, for what only a process shows.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from hpc_train.cli import main
from hpc_train.rundir import RunPaths
from tests.runs import BAD_SPECS, cli, driver_argv, path_without, run_dirs

SPY = '#!/bin/sh\necho "$@" >> "$(dirname "$0")/../sbatch-called"\necho "Submitted batch job 999"\n'
CONTROLLER_UP = '#!/bin/sh\necho "Slurmctld(primary) at spy is UP"\n'


@pytest.fixture(scope="module")
def spy_env(tmp_path_factory):
    """PATH whose `sbatch` only records that it was called."""
    root = tmp_path_factory.mktemp("spy")
    stubs = {"sbatch": SPY, "srun": "#!/bin/sh\n", "scontrol": CONTROLLER_UP}
    return root, {**os.environ, "PATH": path_without(root / "bin", replacements=stubs)}


def _expected(bad_spec: Path) -> str:
    return bad_spec.read_text().splitlines()[0].removeprefix("# expect:").strip()


@pytest.mark.parametrize("bad_spec", BAD_SPECS, ids=lambda p: p.stem)
@pytest.mark.parametrize("dry_run", [False, True], ids=["submit", "dry-run"])
def test_bad_spec_never_reaches_sbatch(bad_spec, dry_run, spy_env, tmp_path, monkeypatch, capsys):
    root, env = spy_env
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.chdir(tmp_path)
    code = main(["submit", str(bad_spec), *(["--dry-run"] if dry_run else [])])
    out = capsys.readouterr()
    assert code == 2, out.out + out.err
    assert _expected(bad_spec) in out.err
    assert not (root / "sbatch-called").exists()
    assert not (tmp_path / "runs").exists()          # no run directory either


def test_a_bad_spec_is_refused_by_the_real_command(spy_env, tmp_path):
    """The exit status and stderr of a real `python -m hpc_train submit`, and no traceback."""
    root, env = spy_env
    bad_spec = BAD_SPECS[0]
    out = cli("submit", str(bad_spec), env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert _expected(bad_spec) in out.stderr and "Traceback" not in out.stderr
    assert not (root / "sbatch-called").exists() and not (tmp_path / "runs").exists()


def test_spy_records_a_valid_submission(spy_env, tmp_path):
    # The same setup does see a good spec reach sbatch: the refusals above are not vacuous.
    root, env = spy_env
    out = cli("submit", "jobs/smoke.yaml", "--set", f"run.root={tmp_path}/runs", env=env)
    assert (root / "sbatch-called").exists(), out.stderr
    submitted = Path((root / "sbatch-called").read_text().split()[-1]).read_text()
    (root / "sbatch-called").unlink()
    # sbatch got the script kept in the run directory, and it execs our driver on that directory.
    [run_dir] = run_dirs(tmp_path / "runs")
    assert "job id:  999" in out.stdout and RunPaths(run_dir).sbatch.read_text() == submitted
    [driver] = [line for line in submitted.splitlines() if line.startswith("exec ")]
    assert driver_argv(driver) == [sys.executable, "-m", "hpc_train.job.driver", str(run_dir)]
    # By default the job imports the run's code snapshot, linked in the run directory.
    assert f"PYTHONPATH={RunPaths(run_dir).code}" in shlex.split(driver)[2]
    assert (RunPaths(run_dir).code / "hpc_train" / "job" / "driver.py").is_file()
    # It ends with how to follow the job: commands that run as printed.
    follow = out.stdout.split("follow it:\n")[1].splitlines()
    commands = [shlex.split(line.split("#")[0]) for line in follow]
    assert [c[:4] for c in commands[:3]] == [["python", "-m", "hpc_train", name] for name in
                                            ("status", "logs", "diagnose")]
    assert all(c[4] == str(run_dir) for c in commands[:3]) and "-f" in commands[1]
    assert commands[3] == ["tensorboard", "--logdir", f"{run_dir}/tensorboard"]
    status = cli(*commands[0][3:], "--no-slurm")
    assert status.returncode == 0 and "run:" in status.stdout, status.stderr


@pytest.mark.parametrize("conf", ["dead", "missing"])
def test_a_controller_that_does_not_answer_is_one_line_with_both_fixes(conf, tmp_path):
    """sbatch installed, Slurm not started (or SLURM_CONF wrong): the real scontrol asks."""
    root = tmp_path / "spy"
    env = {**os.environ, "PATH": path_without(root / "bin", replacements={"sbatch": SPY})}
    dead = tmp_path / "slurm.conf"
    # A controller on a port where nothing listens.
    dead.write_text("ClusterName=nowhere\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=9\n")
    env["SLURM_CONF"] = str(dead if conf == "dead" else tmp_path / "no-such.conf")
    out = cli("submit", "jobs/smoke.yaml", "--set", f"run.root={tmp_path}/runs", env=env, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stderr.splitlines()
    assert "controller does not answer" in line and "env/slurm/start.sh" in line and "--local" in line
    assert not (root / "sbatch-called").exists() and not (tmp_path / "runs").exists()
