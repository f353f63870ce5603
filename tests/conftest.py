"""Shared fixtures: the real single-node Slurm, the 8-node Slurm on this machine, and an mpirun
command line for this host.

The Slurm fixtures use a cluster that already answers (`sinfo`), or start the project's own
(env/slurm/start.sh, with --nodes 8 for `slurm_nodes`) for the session and stop it afterwards.
Under CI=true a missing cluster is a failure, never a skip: the end-to-end tests are the point.

Tests marked `heavy` (the whole matrix of a feature, where CI runs a reduced form of it) run only
on request: `pytest --heavy`, or HPC_TRAIN_HEAVY=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpc_train.launch.local import find_local_mpirun

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true",
                     help="also run the tests marked heavy (whole matrices; CI runs reduced forms)")


def heavy_requested(config) -> bool:
    return config.getoption("--heavy") or os.environ.get("HPC_TRAIN_HEAVY") == "1"


def heavy_params(names, heavy: set) -> list:
    """Test parameters for `names`, the ones in `heavy` marked heavy (CI runs the others)."""
    return [pytest.param(name, marks=[pytest.mark.heavy] if name in heavy else []) for name in names]


def selected_plan(config, plan: dict, heavy: set) -> dict:
    """A module's plan of jobs without its heavy entries, unless heavy tests were asked for: a
    fixture that submits every job at once then submits only what the selected tests read."""
    return plan if heavy_requested(config) else {k: v for k, v in plan.items() if k not in heavy}


def tier(item) -> str:
    """What a test needs, which sets what it costs: `multinode` (the 8-node Slurm), `slurm` (the
    single-node one), `ranks` (real ranks started here, with mpirun), `fast` (none of these)."""
    for marker in ("multinode", "slurm"):
        if item.get_closest_marker(marker):
            return marker
    return "ranks" if item.get_closest_marker("slow") or item.get_closest_marker("mpi") else "fast"


def pytest_collection_modifyitems(config, items):
    # The JUnit report carries each test's tier: .ci/times.py sums CI's time by it.
    for item in items:
        item.user_properties.append(("tier", tier(item)))
    # Modules with the most tests that start ranks or jobs first: pytest-xdist hands out modules
    # in this order, and a long module handed out last runs alone on one worker while the other
    # has nothing left. (A count, not a measured time: it needs no file of past durations.)
    costly = Counter(item.path for item in items if tier(item) != "fast" and "heavy" not in item.keywords)
    items.sort(key=lambda item: -costly[item.path])
    if heavy_requested(config):
        return
    skip = pytest.mark.skip(reason="heavy: runs with --heavy or HPC_TRAIN_HEAVY=1 (CI runs its reduced form)")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


_CPU_AT_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """CPU time of this process and of every process it started and waited for (ranks under a
    driver under `cli`, mpirun's ranks): what a test costs a machine whose cores are all busy."""
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


# The JUnit report carries each test's CPU seconds beside its wall time (setup, call and
# teardown, as its time): CI is CPU-bound, so .ci/times.py ranks modules by both. A Slurm job's
# ranks are slurmd's children, not ours: their CPU is in sacct, not here.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_START] = _cpu_seconds()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown" and _CPU_AT_START in item.stash:   # before its report is made
        item.user_properties.append(("cpu_seconds", f"{_cpu_seconds() - item.stash[_CPU_AT_START]:.2f}"))


def _unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the real component is required)")
    pytest.skip(reason)


def require(module: str):
    """`import module`, or skip the test where it is not installed; under CI=true a missing
    module is a failure, as every other missing part is (env/setup.sh installs them all)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        _unavailable(f"{module} is not installed ({error}); bash env/setup.sh installs it")


def _slurm_answers(env: dict[str, str] | None = None) -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10, env=env).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


@dataclass
class SlurmCluster:
    started_here: bool
    job_ids: list[str] = field(default_factory=list)
    # Environment of every Slurm command; None = ours (the single-node cluster, /etc/slurm).
    env: dict[str, str] | None = None

    def sbatch(self, *args: str) -> str:
        """Submit with --parsable; remember the id so teardown can cancel leftovers."""
        out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True,
                             timeout=30, check=True, env=self.env).stdout.strip()
        job_id = out.split(";")[0]
        self.job_ids.append(job_id)
        return job_id

    def wait_state(self, job_id: str, states: set[str], timeout: float = 120) -> str:
        """Poll sacct until the job's latest record reaches one of `states`; return the state.
        A job that lost a node under --no-kill has two: RESIZING (all its nodes), then its own."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
                                 capture_output=True, text=True, timeout=20, env=self.env).stdout
            # The last row ("CANCELLED by 0": its first word): a requeued job's latest run, a
            # shrunk job's record after its resize.
            rows = [row.split()[0] for row in out.splitlines() if row.strip()]
            state = rows[-1] if rows else ""
            if state in states:
                return state
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {state or 'unknown'} after {timeout} s")


@pytest.fixture(scope="session")
def slurm_cluster():
    if _slurm_answers():
        cluster = SlurmCluster(started_here=False)
    else:
        if os.geteuid() != 0:
            _unavailable("no Slurm answers and env/slurm/start.sh needs root")
        start = subprocess.run(["bash", str(REPO / "env/slurm/start.sh")], capture_output=True,
                               text=True, timeout=300)
        if start.returncode != 0:
            _unavailable(f"env/slurm/start.sh failed:\n{start.stdout}\n{start.stderr}")
        cluster = SlurmCluster(started_here=True)
    yield cluster
    if cluster.job_ids:
        subprocess.run(["scancel", *cluster.job_ids], capture_output=True, timeout=30)
    if cluster.started_here:
        subprocess.run(["bash", str(REPO / "env/slurm/stop.sh")], capture_output=True, timeout=120)


@dataclass
class SlurmNodes(SlurmCluster):
    """The multi-node cluster: its own slurm.conf, used through `env` (SLURM_CONF=conf)."""
    conf: str = ""
    nodes: list[str] = field(default_factory=list)


# The multi-node cluster's size: `bench scale` runs at 2, 4 and 8 nodes; the other multi-node
# tests use 2 or 3 of them (the node-failure ones need a third, a spare or an idle one).
CLUSTER_NODES = 8
FEWEST_NODES = 3


@pytest.fixture(scope="session")
def slurm_nodes():
    """The 8-node cluster of env/slurm/start.sh --nodes 8 (hpcn1..8, one network namespace
    each), independent of the single-node one. Point Slurm commands at it with `env`."""
    state = Path(os.environ.get("HPC_TRAIN_SLURM_NODES_STATE") or REPO / ".slurm-state-nodes").resolve()
    conf = state / "etc" / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started_here = False
    if not (conf.is_file() and _slurm_answers(env)):
        if os.geteuid() != 0:
            _unavailable(f"the {CLUSTER_NODES}-node Slurm does not answer and env/slurm/start.sh "
                         f"--nodes {CLUSTER_NODES} needs root")
        start = subprocess.run(["bash", str(REPO / "env/slurm/start.sh"), "--nodes", str(CLUSTER_NODES)],
                               capture_output=True, text=True, timeout=300)
        if start.returncode != 0:
            _unavailable(f"env/slurm/start.sh --nodes {CLUSTER_NODES} failed:\n{start.stdout}\n{start.stderr}")
        started_here = True
    nodes = [line.split()[0] for line in (state / "nodes").read_text().splitlines() if line.strip()]
    if len(nodes) < FEWEST_NODES:
        _unavailable(f"the multi-node Slurm of {state} has {len(nodes)} nodes, the tests need "
                     f"{FEWEST_NODES} ({CLUSTER_NODES} for bench scale's): bash env/slurm/stop.sh "
                     f"--nodes {len(nodes)} && bash env/slurm/start.sh --nodes {CLUSTER_NODES}")
    cluster = SlurmNodes(started_here=started_here, env=env, conf=str(conf), nodes=nodes)
    yield cluster
    if cluster.job_ids:
        subprocess.run(["scancel", *cluster.job_ids], capture_output=True, timeout=30, env=env)
    if cluster.started_here:
        subprocess.run(["bash", str(REPO / "env/slurm/stop.sh"), "--nodes", str(len(cluster.nodes))],
                       capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def mpirun_argv():
    """`mpirun_argv(n)` -> the argv prefix that starts n ranks on this host."""
    mpirun = find_local_mpirun()
    if mpirun is None:
        _unavailable("mpirun not on PATH (bash env/setup.sh installs OpenMPI)")
    return mpirun.argv


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture
def jpeg_decoders() -> list[str]:
    """The JPEG decoders this environment has, slowest first: pillow always, simplejpeg when
    installed, cropjpeg when built (env/setup.sh)."""
    from hpc_train.data import decode

    return decode.installed_decoders()[::-1]
