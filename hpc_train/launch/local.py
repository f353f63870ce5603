"""mpirun on this host, outside a Slurm allocation: for doctor, the benchmarks and the tests."""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass

from hpc_train import _proc
from hpc_train.launch.mpi import MpiInfo, local_run_flags, parse_mpirun_version


@dataclass(frozen=True)
class LocalMpirun:
    path: str
    info: MpiInfo

    def argv(self, ranks: int) -> list[str]:
        """The argv prefix that starts `ranks` ranks here (as root, more ranks than cores)."""
        flags = local_run_flags(self.info.flavour, as_root=os.geteuid() == 0, oversubscribe=True)
        return [self.path, "-np", str(ranks), *flags]


def find_local_mpirun() -> LocalMpirun | None:
    """The mpirun on PATH and its flavour, or None when there is none."""
    path = shutil.which("mpirun")
    if path is None:
        return None
    return LocalMpirun(path, parse_mpirun_version(_proc.run([path, "--version"], timeout=20).stdout))


def free_port() -> int:
    """A TCP port free on this host now, for a rendezvous (MASTER_PORT) of local ranks."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
