"""A rank's entry point: `python -m hpc_train.job.worker RUN_DIR` (started by mpirun or srun).

The rank writes everything, tracebacks included, to its own log file (in the run directory, or
on its node to be gathered into the node's log: log.rank_logs), records a `rank_failed` event
naming itself when it raises, so diagnosis never has to guess, and beats its heartbeat from the
first moment, so the driver's watchdog sees it start. Its beats and its node's gathered lines
reach the run directory through the node's writer (runtime/node_beats.py).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from hpc_train import events
from hpc_train.errors import LaunchError
from hpc_train.launch.identity import rank_from_env
from hpc_train.launch.network import NETWORK_ENV, rank_interface_env
from hpc_train.rundir import RunPaths
from hpc_train.runtime.gpu_sampler import start_sampler
from hpc_train.runtime.heartbeat import AUTO, AUTO_START_SECONDS, Heartbeat, Phase
from hpc_train.runtime.node_beats import NodeWriter
from hpc_train.runtime.node_local import NodeLocal, node_local_dir, sweep_stale
from hpc_train.runtime.node_log import RANK_LOGS_ENV, RankLogs
from hpc_train.runtime.netif import ipv4_addresses
from hpc_train.runtime.stop import NODES_ENV, STALL_ENV, START_ENV, STOP_EXIT, StopFlag
from hpc_train.spec.global_batch import fit_to_nodes
from hpc_train.spec.schema import DEFAULT_STALL_SECONDS, JobSpec


def redirect_output(path: Path) -> None:
    """Point this process's stdout and stderr (fds 1 and 2, so C libraries too) at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def setup_logging(rank: int) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format=f"%(asctime)s rank {rank} %(name)s %(levelname)s %(message)s")


def join_network(environ, rank: int) -> None:
    """Before any collective library starts: point every layer at launch.network_interface on
    this node, and check that MASTER_ADDR resolves here; a node that cannot reach the first one
    otherwise hangs in the rendezvous until the watchdog gives up, with no reason given."""
    here = os.uname().nodename
    setting = environ.get(NETWORK_ENV)
    if setting:
        try:
            chosen = rank_interface_env(setting, ipv4_addresses())
        except LookupError as exc:
            raise LaunchError(f"rank {rank} on {here}: launch.network_interface: {exc}") from None
        environ.update(chosen)
        logging.getLogger("hpc_train.worker").info(
            "network %s: interface %s for Gloo, NCCL and Horovod", setting,
            chosen["GLOO_SOCKET_IFNAME"])
    master = environ.get("MASTER_ADDR")
    if master:
        try:
            socket.getaddrinfo(master, None, proto=socket.IPPROTO_TCP)
        except OSError as exc:
            raise LaunchError(f"rank {rank} on {here}: MASTER_ADDR {master!r} does not resolve "
                              f"({exc}); check the node's /etc/hosts or DNS, or set "
                              "launch.network_interface") from None


def start_rank(paths: RunPaths, rank: int) -> StopFlag:
    """A rank's first steps, before any heavy import: its own log, crash stacks, stop handlers."""
    redirect_output(NodePlace.here(paths, os.environ).rank_log(rank))
    # A segfault or abort in native code then leaves "Fatal Python error" and the Python stack of
    # every thread in this rank's log instead of nothing.
    faulthandler.enable(all_threads=True)
    # Handlers first: a USR2/TERM that arrives while torch is still importing must not kill us.
    stop = StopFlag.from_env()
    setup_logging(rank)
    return stop


@dataclass(frozen=True)
class NodePlace:
    """Where this rank's beat and output go: the node-local directory, and whether its output
    is gathered into the node's log (log.rank_logs: per_node, from the driver)."""
    paths: RunPaths
    local: NodeLocal
    host: str
    per_node_logs: bool

    @classmethod
    def here(cls, paths: RunPaths, environ) -> NodePlace:
        host = os.uname().nodename
        local = NodeLocal(node_local_dir(environ, paths.root, host)).make()
        sweep_stale(local.root.parent, keep=local.root)   # killed jobs' leftovers, an hour old
        return cls(paths, local, host, environ.get(RANK_LOGS_ENV) == RankLogs.PER_NODE.value)

    def rank_log(self, rank: int) -> Path:
        return self.local.log(rank) if self.per_node_logs else self.paths.rank_log(rank)


def start_heartbeat(paths: RunPaths, rank: int) -> Heartbeat:
    """The rank's heartbeat thread, beating at the driver's launch.stall_seconds, with its part
    in writing the node's beats (and lines) to the run directory: its close is the rank's last
    act there (the node's last rank writes once more)."""
    place = NodePlace.here(paths, os.environ)
    setting = os.environ.get(STALL_ENV) or DEFAULT_STALL_SECONDS
    heartbeat = Heartbeat(place.local.beat(rank), rank, AUTO if setting == AUTO else float(setting),
                          host=place.host,
                          start_seconds=float(os.environ.get(START_ENV) or AUTO_START_SECONDS))
    node = NodeWriter(place.local, rank, place.host, paths.node_heartbeat(place.host),
                      heartbeat.interval, paths.node_log(place.host) if place.per_node_logs else None)
    heartbeat.after_beat, heartbeat.after_close = node.tick, node.close
    heartbeat.start()
    node.tick()
    return heartbeat


def start_spec(written: JobSpec, environ) -> JobSpec:
    """The spec this start's ranks train with: the run's, fitted to the nodes the driver started
    them on (NODES_ENV, within slurm.nodes' range), or as written when it is not set."""
    nodes = environ.get(NODES_ENV)
    return fit_to_nodes(written, int(nodes)) if nodes else written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_train.job.worker RUN_DIR", file=sys.stderr)
        return 2
    paths = RunPaths(Path(args[0]))
    identity = rank_from_env(os.environ)
    stop = start_rank(paths, identity.rank)
    log = logging.getLogger("hpc_train.worker")
    log.info("rank %d/%d (local %d) pid %d on %s, code %s", identity.rank, identity.size,
             identity.local_rank, os.getpid(), os.uname().nodename, Path(__file__).parents[1])
    heartbeat = start_heartbeat(paths, identity.rank)
    try:
        return run_rank(paths, identity, stop, heartbeat)
    finally:
        heartbeat.close()     # last, after the rank's last line: it may be gathered with it


def run_rank(paths: RunPaths, identity, stop: StopFlag, heartbeat: Heartbeat) -> int:
    """The rank's work between its first beat and its node's last write."""
    log = logging.getLogger("hpc_train.worker")
    # GPU utilisation for `report`, from the node's first rank (nothing without NVML or a GPU).
    sampler = start_sampler(paths.gpu_samples(os.uname().nodename), os.environ, identity.local_rank)
    trainer = None
    try:
        # Heavy imports after the redirect: an import error lands in this rank's log too.
        from hpc_train.job.shard_place import shard_root
        from hpc_train.spec import load_spec
        from hpc_train.train.checkpointing import StopForRequeue
        from hpc_train.train.trainer import Trainer
        from hpc_train.usercode import add_to_path

        heartbeat.progress(phase=Phase.NETWORK)
        join_network(os.environ, identity.rank)
        written = load_spec(paths.spec)
        # The folders of the user's packages (run.code), after the run's code snapshot, which
        # holds the copies taken at submit and so comes first.
        add_to_path(written.run.code)
        spec = start_spec(written, os.environ)
        data_root = shard_root(spec, paths, identity, heartbeat)
        heartbeat.progress(phase=Phase.BUILDING)
        trainer = Trainer(spec, paths, identity, stop, heartbeat, data_root=data_root,
                          written=written)
        try:
            trainer.fit()
        except StopForRequeue as stop_reason:
            log.info("rank %d stopped (%s) after saving; exit %d", identity.rank, stop_reason, STOP_EXIT)
            trainer.backend.shutdown()
            return STOP_EXIT
    except BaseException as exc:  # noqa: BLE001 - every failure is recorded, then re-raised
        log.error("rank %d failed:\n%s", identity.rank, traceback.format_exc())
        events.try_record(paths, events.rank_failed(identity.rank, f"{type(exc).__name__}: {exc}",
                                                    traceback.format_exc()[-4000:]))
        raise
    finally:
        if trainer is not None:
            trainer.close()
        if sampler is not None:
            sampler.close()
    log.info("rank %d done", identity.rank)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
