"""The environment record: which variables are kept (secrets redacted), loaded modules, the git
state of a checkout (a real git repository here), and the lines of environment.jsonl."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hpc_train.rundir import RunPaths
from hpc_train.runtime import environment

ENVIRON = {
    "OMPI_MCA_btl": "^openib", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0",
    "HOROVOD_FUSION_THRESHOLD": "67108864", "SLURM_JOB_ID": "42", "SLURM_JWT": "eyJhbGc.secret",
    "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin",
    "LOADEDMODULES": "gcc/12.2:openmpi/4.1.4::cuda/12.2", "HOME": "/home/me",
    "AWS_SECRET_ACCESS_KEY": "nope", "MY_API_TOKEN": "nope", "HPC_TRAIN_FAULT": "freeze:1:3",
    "PMIX_RANK": "0", "UCX_TLS": "rc", "I_MPI_FABRICS": "shm:ofi", "NCCL_IB_KEY": "x",
}


def test_variables_keep_the_launch_related_ones_and_redact_secrets():
    kept = environment.variables(ENVIRON)
    assert list(kept) == sorted(kept)
    assert kept["OMPI_MCA_btl"] == "^openib" and kept["NCCL_SOCKET_IFNAME"] == "ib0"
    assert kept["HOROVOD_FUSION_THRESHOLD"] == "67108864" and kept["SLURM_JOB_ID"] == "42"
    assert kept["PMIX_RANK"] == "0" and kept["UCX_TLS"] == "rc" and kept["I_MPI_FABRICS"] == "shm:ofi"
    assert kept["SLURM_JWT"] == environment.REDACTED and kept["NCCL_IB_KEY"] == environment.REDACTED
    assert "HOME" not in kept and "AWS_SECRET_ACCESS_KEY" not in kept and "MY_API_TOKEN" not in kept
    assert "eyJhbGc.secret" not in str(kept)


def test_loaded_modules_from_loadedmodules():
    assert environment.loaded_modules(ENVIRON) == ["gcc/12.2", "openmpi/4.1.4", "cuda/12.2"]
    assert environment.loaded_modules({}) == []


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_git_state_of_a_checkout_with_uncommitted_changes(tmp_path):
    repo = tmp_path / "repo"
    package = repo / "pkg"
    package.mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    clean = environment.git_state(package)
    assert clean["commit"] == _git(repo, "rev-parse", "HEAD") and clean["branch"] == "main"
    assert clean["dirty"] is False and clean["diff"] == "" and clean["untracked"] == []
    (package / "a.py").write_text("A = 2\n")
    (package / "new.py").write_text("")
    dirty = environment.git_state(package)
    assert dirty["dirty"] is True and "-A = 1\n+A = 2" in dirty["diff"]
    assert dirty["untracked"] == ["pkg/new.py"] and dirty["untracked_count"] == 1
    assert not dirty["diff_truncated"]


def test_no_git_state_outside_a_checkout(tmp_path):
    assert environment.git_state(tmp_path) is None


def test_records_are_lines_of_the_run_environment_file(tmp_path):
    paths = RunPaths.new(tmp_path, "r")
    environment.record(paths, environment.login_record("submit", ENVIRON, tmp_path, None))
    environment.record(paths, environment.job_record(
        {**ENVIRON, "SLURM_RESTART_COUNT": "2"}, {"MASTER_ADDR": "n1", "NCCL_SOCKET_IFNAME": "ib0"},
        tmp_path / "code" / "hpc_train"))
    login, job = environment.read(paths)
    assert login["where"] == "submit" and login["git"] is None and login["snapshot"] is None
    assert login["modules"] == ["gcc/12.2", "openmpi/4.1.4", "cuda/12.2"]
    assert "pyyaml" in {name.lower() for name in login["packages"]}
    assert job["where"] == "job" and job["job_id"] == "42" and job["restart"] == 2
    assert job["rank_env"] == {"MASTER_ADDR": "n1", "NCCL_SOCKET_IFNAME": "ib0"}
    assert job["code"].endswith("code/hpc_train") and job["variables"]["SLURM_JWT"] == "<redacted>"
