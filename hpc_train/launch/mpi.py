"""Which MPI implementation `mpirun` is, and the flags each one needs.

Pure functions of the `mpirun --version` text, so they are tested on recorded samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class MpiFlavour(str, Enum):
    OPENMPI = "openmpi"
    MPICH = "mpich"
    INTEL = "intel"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class MpiInfo:
    flavour: MpiFlavour
    version: str  # "" when the text does not say

    def describe(self) -> str:
        names = {
            MpiFlavour.OPENMPI: "Open MPI",
            MpiFlavour.MPICH: "MPICH",
            MpiFlavour.INTEL: "Intel MPI",
            MpiFlavour.UNKNOWN: "unknown MPI",
        }
        return f"{names[self.flavour]} {self.version}".strip()


def parse_mpirun_version(text: str) -> MpiInfo:
    """Recognise the implementation from `mpirun --version` output."""
    if m := re.search(r"\(Open MPI\)\s+(\S+)", text):
        return MpiInfo(MpiFlavour.OPENMPI, m.group(1))
    if m := re.search(r"Intel\(R\) MPI Library.*?Version\s+(\S+)", text, re.S):
        return MpiInfo(MpiFlavour.INTEL, m.group(1))
    if "HYDRA" in text or "MPICH" in text.upper():
        m = re.search(r"Version:\s+(\S+)", text)
        return MpiInfo(MpiFlavour.MPICH, m.group(1) if m else "")
    return MpiInfo(MpiFlavour.UNKNOWN, "")


def local_run_flags(flavour: MpiFlavour, as_root: bool, oversubscribe: bool) -> list[str]:
    """Flags for a run on this host outside a Slurm allocation (doctor, tests).

    Open MPI refuses to run as root without an explicit opt-in, and refuses more ranks than
    cores unless told to oversubscribe; MPICH and Intel MPI need neither.
    """
    if flavour is not MpiFlavour.OPENMPI:
        return []
    flags = []
    if as_root:
        flags.append("--allow-run-as-root")
    if oversubscribe:
        flags.append("--oversubscribe")
    return flags
