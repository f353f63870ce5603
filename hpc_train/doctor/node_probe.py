"""One rank of `doctor --allocation`: what this node has, whether it reaches MASTER_ADDR, and an
allreduce across every rank, written to OUT_DIR/rank-N.json (run by the doctor under mpirun or
srun: `python -m hpc_train.doctor.node_probe OUT_DIR`).

One file per rank, not stdout: the launcher interleaves the ranks' output. The report is written
twice, after this node's own checks and again after the allreduce, so a rank that hangs in MPI
(the doctor's timeout then ends it) still says how far it got. Every finding goes into the
report; the exit status is 0 unless the probe itself could not run.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

from hpc_train.doctor.faults import VERSION_SUFFIX, faults_here
from hpc_train.launch.identity import rank_from_env
from hpc_train.rundir import write_atomic

PACKAGES = ("hpc_train", "torch", "horovod", "mpi4py", "numpy", "h5py")
ALLREDUCE_BYTES = 4 * 2**20
REPETITIONS = 5
# How long a rank keeps trying MASTER_ADDR: rank 0 may still be starting its listener.
CONNECT_SECONDS = 30.0


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def package_versions(faults: set[str]) -> dict[str, str]:
    """Installed versions from the package metadata ("missing" when not installed): exact, and
    no import needed. A version fault marks hpc_train's as another install's would differ."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    if "version" in faults:
        versions["hpc_train"] += VERSION_SUFFIX
    return versions


def torch_facts() -> dict:
    """GPUs torch sees here and Horovod's build flags; an import error is reported, not raised."""
    facts: dict = {}
    try:
        import torch

        facts["gpus"] = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001 - a broken torch is the finding
        facts["gpus"], facts["gpu_error"] = None, _error(exc)
    try:
        import horovod.torch as hvd

        facts["horovod_build"] = {"mpi_built": bool(hvd.mpi_built()), "gloo_built": bool(hvd.gloo_built()),
                                  "nccl_built": bool(hvd.nccl_built())}
    except Exception as exc:  # noqa: BLE001
        facts["horovod_build"] = {"error": _error(exc)}
    return facts


class Listener:
    """Rank 0's TCP listener on MASTER_PORT, which every rank connects to, as torch.distributed's
    rendezvous would. It accepts in a daemon thread and stays open until every rank connected or
    the connect window has passed, so a peer that is slow to start is not refused."""

    def __init__(self, port: int):
        self.accepted = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("", port))
        self.sock.listen(128)
        self.sock.settimeout(1.0)
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.close()
            self.accepted += 1

    def close(self, ranks: int, until: float) -> None:
        while self.accepted < ranks and time.monotonic() < until:
            time.sleep(0.1)
        self.closed.set()
        self.sock.close()


def reach(host: str, port: int, until: float) -> dict:
    """Connect to host:port, retrying refusals and timeouts until `until` (monotonic)."""
    start = time.monotonic()
    last = "not tried"
    while True:
        try:
            with socket.create_connection((host, port), timeout=5):
                return {"ok": True, "detail": "connected", "seconds": round(time.monotonic() - start, 3)}
        except socket.gaierror as exc:
            return {"ok": False, "detail": f"{host} does not resolve: {exc}"}
        except OSError as exc:
            last = _error(exc)
        if time.monotonic() >= until:
            return {"ok": False, "detail": f"no connection within {CONNECT_SECONDS:g} s: {last}"}
        time.sleep(0.5)


def allreduce(rank: int, size: int, faults: set[str]) -> dict:
    """A 4 MiB float32 allreduce of rank+1 with mpi4py: every element must be size*(size+1)/2,
    where size is the world the launcher meant (a rank that MPI started alone sees a sum of its
    own). mpi4py, not Horovod: a failure here points at MPI and the launcher."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    send = np.full(ALLREDUCE_BYTES // 4, rank + 1, dtype=np.float32)
    received = np.empty_like(send)
    comm.Barrier()
    comm.Allreduce(send, received, op=MPI.SUM)
    if "allreduce" in faults:
        received[0] += 1
    expected = size * (size + 1) // 2
    bad = np.flatnonzero(received != expected)
    got = float(received[bad[0]]) if bad.size else float(expected)  # before the timing reuses it
    times = []
    for _ in range(REPETITIONS):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(send, received, op=MPI.SUM)
        times.append(time.perf_counter() - start)
    return {"ok": bad.size == 0, "expected": expected, "got": got, "wrong_elements": int(bad.size),
            "mpi_rank": comm.Get_rank(), "mpi_size": comm.Get_size(), "bytes": ALLREDUCE_BYTES,
            "repetitions": REPETITIONS, "seconds_mean": sum(times) / len(times)}


def write_report(out_dir: Path, rank: int, report: dict) -> None:
    # Whole or not at all: the doctor never reads half a report.
    write_atomic(out_dir / f"rank-{rank}.json", json.dumps(report, indent=1).encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_train.doctor.node_probe OUT_DIR", file=sys.stderr)
        return 2
    out_dir = Path(args[0])
    me = rank_from_env(os.environ)
    host = socket.gethostname()
    faults = faults_here(os.environ, host)
    master, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", "0"))
    until = time.monotonic() + CONNECT_SECONDS
    listener, listen_error = None, ""
    if me.rank == 0 and port:
        try:
            listener = Listener(port)   # first thing: the peers' connects start seconds from now
        except OSError as exc:
            listen_error = f"rank 0 could not listen on port {port}: {_error(exc)}"
    report = {"rank": me.rank, "size": me.size, "local_rank": me.local_rank, "host": host,
              "pid": os.getpid(), "stage": "local", "python": sys.version.split()[0],
              "executable": sys.executable, "versions": package_versions(faults), **torch_facts(),
              "faults": sorted(faults)}
    if not master or not port:
        report["master"] = {"ok": False, "detail": "MASTER_ADDR or MASTER_PORT not set"}
    else:
        report["master"] = {"addr": master, "port": port, **reach(master, port, until)}
        if listen_error:
            report["master"]["detail"] += f" ({listen_error})"
    if "noreport" not in faults:
        write_report(out_dir, me.rank, report)
    try:
        report["allreduce"] = allreduce(me.rank, me.size, faults)
    except Exception as exc:  # noqa: BLE001 - e.g. mpi4py missing: the finding, not a crash
        report["allreduce"] = {"ok": False, "error": _error(exc)}
    finally:
        if listener is not None:
            listener.close(me.size, until)
    report["stage"] = "done"
    if "noreport" not in faults:
        write_report(out_dir, me.rank, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
