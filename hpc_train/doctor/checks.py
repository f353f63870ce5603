"""The doctor's checks. Each returns `Check` rows; none raises for an expected failure.

Checks that need torch, Horovod or several ranks run in subprocesses, so the doctor itself stays
a light login-node command and a crashing library cannot take the report down with it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass
from enum import Enum
from importlib import metadata

from hpc_train import _proc, scheduler
from hpc_train.launch.local import find_local_mpirun
from hpc_train.launch.mpi import MpiFlavour
from hpc_train.launch.network import DEFAULT_MASTER_PORT
from hpc_train.scheduler.policy import preemption_words

SETUP_FIX = "run `bash env/setup.sh` from the repository root"
SLURM_FIX = "start the single-node cluster with `bash env/slurm/start.sh`, or load your site's Slurm module"


class Status(str, Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status.value}


# ---------------------------------------------------------------- pure helpers (unit-tested)

def version_tuple(version: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); stops at the first part that is not a number."""
    parts = []
    for piece in re.split(r"[.+-]", version):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def parse_requirement(line: str) -> tuple[str, str] | None:
    """'torch>=2.1' -> ('torch', '2.1'); None for extras-only requirements."""
    if ";" in line and "extra" in line.split(";", 1)[1]:
        return None
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:>=\s*([0-9][^,;\s]*))?", line)
    return (m.group(1), m.group(2) or "") if m else None


def package_check(name: str, minimum: str, installed: str | None) -> Check:
    if installed is None:
        return Check(f"package {name}", Status.FAIL, "not installed", SETUP_FIX)
    if minimum and version_tuple(installed) < version_tuple(minimum):
        return Check(f"package {name}", Status.FAIL, f"{installed} < required {minimum}",
                     f"pip install '{name}>={minimum}' (or {SETUP_FIX})")
    return Check(f"package {name}", Status.OK, installed)


# ---------------------------------------------------------------- checks

def check_python() -> list[Check]:
    v = sys.version_info
    status = Status.OK if v >= (3, 10) else Status.FAIL
    return [Check("python", status, f"{v.major}.{v.minor}.{v.micro} at {sys.executable}",
                  "" if status is Status.OK else "use Python >= 3.10")]


def check_packages() -> list[Check]:
    try:
        requirements = metadata.requires("hpc_train") or []
    except metadata.PackageNotFoundError:
        return [Check("package hpc_train", Status.FAIL, "not installed in this Python", SETUP_FIX)]
    rows = []
    for line in requirements:
        parsed = parse_requirement(line)
        if parsed is None:
            continue
        name, minimum = parsed
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        rows.append(package_check(name, minimum, installed))
    return rows


def _torch_probe() -> dict | Check:
    """torch / Horovod / GPU facts from a subprocess (importing torch costs seconds)."""
    res = _proc.run([sys.executable, "-m", "hpc_train.doctor.torch_probe"], timeout=120)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return Check("torch", Status.FAIL, f"probe failed (exit {res.returncode}): {tail[0]}", SETUP_FIX)


def check_torch_horovod_gpus() -> list[Check]:
    probe = _torch_probe()
    if isinstance(probe, Check):
        return [probe]
    rows = [Check("torch", Status.OK, f"{probe['torch']} (CUDA {probe['cuda'] or 'none'})")]
    gpus = probe["gpus"]
    if gpus:
        rows.append(Check("GPUs", Status.OK, f"{len(gpus)}: {', '.join(gpus)}"))
    else:
        rows.append(Check("GPUs", Status.WARN, "none visible: jobs run on the CPU",
                          "on a GPU node: check `nvidia-smi` and that torch is a CUDA build"))
    hvd = probe["horovod"]
    if "error" in hvd:
        rows.append(Check("horovod", Status.FAIL, hvd["error"], "bash env/install-horovod.sh"))
        return rows
    rows.append(Check("horovod", Status.OK, f"{hvd['version']} with PyTorch"))
    rebuild = "HOROVOD_REBUILD=1 bash env/install-horovod.sh"
    for op, label in (("mpi", "MPI"), ("gloo", "Gloo")):
        built = hvd[f"{op}_built"]
        rows.append(Check(f"horovod {label}", Status.OK if built else Status.FAIL,
                          "built" if built else "not built", "" if built else rebuild))
    if hvd["nccl_built"]:
        rows.append(Check("horovod NCCL", Status.OK, "built"))
    elif gpus:
        rows.append(Check("horovod NCCL", Status.WARN, "not built: GPU allreduce goes through MPI",
                          f"load your CUDA toolkit module, then {rebuild}"))
    else:
        rows.append(Check("horovod NCCL", Status.OK, "not built (not needed without GPUs)"))
    return rows


def check_mpirun() -> list[Check]:
    mpirun = find_local_mpirun()
    if mpirun is None:
        return [Check("mpirun", Status.FAIL, "not on PATH",
                      "Debian: apt-get install openmpi-bin libopenmpi-dev; HPC: module load openmpi")]
    info = mpirun.info
    status = Status.OK if info.flavour is not MpiFlavour.UNKNOWN else Status.WARN
    rows = [Check("mpirun", status, f"{info.describe()} at {mpirun.path}")]
    argv = [*mpirun.argv(2), sys.executable, "-m", "hpc_train.doctor.mpi_probe"]
    start = time.perf_counter()
    res = _proc.run(argv, timeout=90)
    wall = time.perf_counter() - start
    try:
        probe = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        rows.append(Check("mpirun 2 ranks", Status.FAIL, f"exit {res.returncode}: {' | '.join(tail)}",
                          "run the command by hand: " + " ".join(argv)))
        return rows
    ok = probe["allreduce_correct"] and probe["size"] == 2
    rows.append(Check(
        "mpirun 2 ranks", Status.OK if ok else Status.FAIL,
        f"barrier + allreduce {'correct' if ok else 'WRONG'}; allreduce latency "
        f"{probe['allreduce_us']:.0f} us (median of {probe['iterations']}); launch {wall:.1f} s",
        "" if ok else "mpi4py and mpirun disagree: reinstall mpi4py against this MPI"))
    return rows


def check_slurm() -> list[Check]:
    partitions, problem = scheduler.partitions()
    if problem is not None:
        return [Check("slurm sinfo", Status.FAIL, problem, SLURM_FIX)]
    problem = scheduler.accounting_problem()
    return [Check("slurm sinfo", Status.OK, "; ".join(partitions) or "no partitions"),
            Check("slurm sacct", Status.OK, "accounting on") if problem is None else
            Check("slurm sacct", Status.WARN, f"accounting off ({problem}): job history comes from run "
                  "directories only", "start slurmdbd (bash env/slurm/start.sh does) or ask your admins"),
            *check_preemption()]


def check_preemption() -> list[Check]:
    """What a preemption does to a job of each partition: its grace (the time a stop save has,
    heard at the grace's start) and KillWait (all it has where nothing hears the start)."""
    policies, problem = scheduler.preemption()
    if problem is not None:
        return [Check("slurm preemption", Status.WARN, f"not known ({problem})")]
    return [Check("slurm preemption", Status.OK, "; ".join(preemption_words(p) for p in policies)
                  or "no partitions")]


def check_master_addr() -> list[Check]:
    """The rendezvous host for torch.distributed: resolvable, and its port usable or reachable."""
    host = os.environ.get("MASTER_ADDR") or socket.gethostname()
    port = int(os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT))
    name = "MASTER_ADDR"
    try:
        addr = socket.gethostbyname(host)
    except OSError as exc:
        return [Check(name, Status.FAIL, f"{host} does not resolve: {exc}",
                      f"add `{host}` to /etc/hosts or set MASTER_ADDR to a resolvable name")]
    try:
        with socket.socket() as server:
            server.bind((addr, port))
            server.listen(1)
            with socket.create_connection((addr, port), timeout=5):
                pass
        return [Check(name, Status.OK, f"{host} -> {addr}; port {port} free and connectable")]
    except OSError as bind_error:
        if bind_error.errno == 98:  # EADDRINUSE: something of ours (or not) listens there
            return [Check(name, Status.WARN, f"{host} -> {addr}; port {port} already in use",
                          "set MASTER_PORT to a free port")]
    # Not a local address: a remote rendezvous host must at least answer on its port.
    try:
        with socket.create_connection((addr, port), timeout=5):
            return [Check(name, Status.OK, f"{host} -> {addr}; port {port} reachable")]
    except ConnectionRefusedError:
        return [Check(name, Status.OK, f"{host} -> {addr}; host answers (nothing listens on {port} yet)")]
    except OSError as exc:
        return [Check(name, Status.FAIL, f"{host} -> {addr}; port {port} unreachable: {exc}",
                      "check firewalls between nodes or pick another MASTER_ADDR/MASTER_PORT")]


ALL_CHECKS = (check_python, check_packages, check_torch_horovod_gpus, check_mpirun, check_slurm,
              check_master_addr)
