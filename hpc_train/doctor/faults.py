"""Fault injection for tests of `doctor --allocation`: make the probe on one node look broken.

The nodes of the test clusters share one filesystem and one Python, so they can never really
disagree; this makes the disagreement paths testable end to end. Set HPC_TRAIN_DOCTOR_FAULT in
the doctor's environment (sbatch exports it to the job, the doctor passes it on to the ranks):
    version@NODE      the probe on NODE reports hpc_train's version with "+doctor-fault"
                      appended, as a node with another install of the package would
    allreduce@NODE    the probe on NODE reports an allreduce result one too large
    noreport@NODE     the probe on NODE writes no report at all (as a rank that never started)
NODE is a host name (its first label is compared). Several faults: separate them with commas.
Unset (always, outside tests) it does nothing. It never reads files or runs anything.
"""

from __future__ import annotations

from collections.abc import Mapping

DOCTOR_FAULT_ENV = "HPC_TRAIN_DOCTOR_FAULT"
KINDS = ("version", "allreduce", "noreport")
VERSION_SUFFIX = "+doctor-fault"


def _short(host: str) -> str:
    return host.split(".")[0]


def parse_doctor_faults(text: str | None) -> dict[str, set[str]]:
    """'version@hpcn2,noreport@hpcn1' -> {'version': {'hpcn2'}, 'noreport': {'hpcn1'}}."""
    faults: dict[str, set[str]] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        kind, at, node = item.strip().partition("@")
        if kind not in KINDS or not at or not node:
            raise ValueError(f"{DOCTOR_FAULT_ENV}={text!r}: expected KIND@NODE[,KIND@NODE...] "
                             f"with KIND one of {', '.join(KINDS)}")
        faults.setdefault(kind, set()).add(_short(node))
    return faults


def faults_here(environ: Mapping[str, str], host: str) -> set[str]:
    """The fault kinds that apply to the probe on `host`."""
    faults = parse_doctor_faults(environ.get(DOCTOR_FAULT_ENV))
    return {kind for kind, nodes in faults.items() if _short(host) in nodes}
