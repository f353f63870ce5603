"""The doctor: pure parsing on recorded samples, then the real checks on this machine."""

import json
import os
import subprocess
import sys

import pytest

from hpc_train.doctor.checks import Status, package_check, parse_requirement, version_tuple
from hpc_train.launch.mpi import MpiFlavour, local_run_flags, parse_mpirun_version
from tests.conftest import REPO

OPENMPI = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
MPICH = ("HYDRA build details:\n    Version:                                 4.0.2\n"
         "    Release Date:                            Thu Apr  7 12:34:45 CDT 2022\n")
INTEL = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"


@pytest.mark.parametrize("text, flavour, version", [
    (OPENMPI, MpiFlavour.OPENMPI, "4.1.4"),
    (MPICH, MpiFlavour.MPICH, "4.0.2"),
    (INTEL, MpiFlavour.INTEL, "2021.10"),
    ("something else\n", MpiFlavour.UNKNOWN, ""),
])
def test_parse_mpirun_version(text, flavour, version):
    info = parse_mpirun_version(text)
    assert (info.flavour, info.version) == (flavour, version)


def test_local_run_flags_only_for_openmpi():
    assert local_run_flags(MpiFlavour.OPENMPI, as_root=True, oversubscribe=True) == [
        "--allow-run-as-root", "--oversubscribe"]
    assert local_run_flags(MpiFlavour.OPENMPI, as_root=False, oversubscribe=False) == []
    assert local_run_flags(MpiFlavour.MPICH, as_root=True, oversubscribe=True) == []


def test_version_tuple_and_requirements():
    assert version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert version_tuple("1.5.4") > version_tuple("1.5.1")
    assert parse_requirement("torch>=2.1") == ("torch", "2.1")
    assert parse_requirement("rich") == ("rich", "")
    assert parse_requirement('pytest>=7.4; extra == "test"') is None


def test_package_check_statuses():
    assert package_check("torch", "2.1", "2.13.0+cpu").status is Status.OK
    old = package_check("torch", "2.1", "2.0.1")
    assert old.status is Status.FAIL and "2.0.1 < required 2.1" in old.detail and old.fix
    assert package_check("h5py", "3.8", None).status is Status.FAIL


def _doctor(env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", "doctor", "--json"], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.horovod
def test_doctor_all_ok_on_a_ready_machine(slurm_cluster):
    out = _doctor()
    report = json.loads(out.stdout)
    status = {c["name"]: c["status"] for c in report["checks"]}
    for name in ("python", "package torch", "package mpi4py", "torch", "horovod", "horovod MPI",
                 "horovod Gloo", "mpirun", "mpirun 2 ranks", "slurm sinfo", "slurm sacct",
                 "MASTER_ADDR"):
        assert status.get(name) == "OK", (name, report)
    assert out.returncode == 0 and report["ok"] is True
    assert report["counts"]["FAIL"] == 0
    latency = next(c for c in report["checks"] if c["name"] == "mpirun 2 ranks")["detail"]
    assert "allreduce correct" in latency and " us " in latency
    # Our cluster as preemptable sites are (env/slurm/start.sh): what a preemption gives a save.
    preemption = next(c for c in report["checks"] if c["name"] == "slurm preemption")
    assert preemption["status"] == "OK" and ("partition debug: PreemptMode REQUEUE "
                                             "(preempt/partition_prio), GraceTime 30 s, KillWait 5 s"
                                             in preemption["detail"]), preemption


@pytest.mark.slow
def test_doctor_fails_with_fix_lines_when_tools_are_missing(tmp_path):
    # A PATH without mpirun and Slurm: those checks must FAIL, say how to fix, and exit 1.
    env = {**os.environ, "PATH": str(tmp_path), "MASTER_ADDR": "no-such-host.invalid"}
    out = _doctor(env)
    assert out.returncode == 1
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    for name in ("mpirun", "slurm sinfo", "MASTER_ADDR"):
        assert checks[name]["status"] == "FAIL", checks[name]
        assert checks[name]["fix"], checks[name]
    assert "apt-get install openmpi-bin" in checks["mpirun"]["fix"]
    assert "env/slurm/start.sh" in checks["slurm sinfo"]["fix"]


@pytest.mark.slow
def test_doctor_plain_text_when_piped():
    out = subprocess.run([sys.executable, "-m", "hpc_train", "doctor"], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env={**os.environ, "PATH": "/nonexistent"})
    first = out.stdout.splitlines()[0]
    assert first.split()[:2] == ["OK", "python"]
    assert "\x1b[" not in out.stdout  # no colour codes in a pipe
