"""The driver: the one process of a job that starts the ranks (mpirun or srun), watches them,
and reports how they ended.

It runs as the batch script itself (`exec python -m hpc_train.job.driver RUN_DIR`, the last line
of the script that submit and render make alike; the pickled `Driver` for submitit's local
executor), so Slurm's `B:USR2` reaches it; it forwards a stop to mpirun,
which passes it to the ranks, and never lets mpirun be SIGKILLed while it has ranks (they would
outlive the job). Every wait here has a bound: the ranks' heartbeats are read between waits, and
ranks that stop progressing (or ignore a stop) are torn down and the job requeued (watchdog.py).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hpc_train
from hpc_train import events, run_state, scheduler
from hpc_train.errors import LaunchError, SpecError
from hpc_train.job.node_fault import NodeFault, node_fault
from hpc_train.job.requeue import (Budget, Decision, Ended, decide, ending_status, requeue_path,
                                  stop_kind, stop_words)
from hpc_train.job.sentinel import Sentinel, sentinel_argv
from hpc_train.job.supervise import LauncherOutput, StopForwarder, Watch, supervise
from hpc_train.job.watchdog import Standing
from hpc_train.launch.allocation import (Allocation, allocation_from_slurm, local_allocation,
                                         training_hosts)
from hpc_train.launch.argv import LaunchPlan, inherited, launch_argv, launcher_env
from hpc_train.launch.identity import LAUNCH_ID_ENV
from hpc_train.launch.horovod import few_core_env, horovod_env
from hpc_train.launch.network import NETWORK_ENV, address_for
from hpc_train.rundir import RunPaths
from hpc_train.runtime import environment
from hpc_train.runtime.netif import ipv4_addresses
from hpc_train.runtime.node_log import RANK_LOGS_ENV, rank_logs_mode
from hpc_train.runtime.stop import DEADLINE_ENV, NODES_ENV, STALL_ENV, START_ENV, STOP_EXIT
from hpc_train.spec import JobSpec, load_spec
from hpc_train.spec.global_batch import fit_to_nodes

log = logging.getLogger("hpc_train.driver")
WORKER = "hpc_train.job.worker"   # the ranks' entry point (`bench train` starts its own)


def rendezvous_ports(job_id: str | None, driver_pid: int, tries: int = 10) -> list[int]:
    """Ports to try for torch.distributed's rendezvous, in order: a block of its own per job id
    (20000-59999, below Linux's ephemeral range), so jobs sharing a node do not collide; outside
    Slurm one per driver process. (One shared block let two local runs started together both find
    its first port free: one's rank joined the other's rendezvous and hung until the watchdog.)"""
    key = int(job_id) if job_id and job_id.isdigit() else driver_pid
    return [20000 + key % 4000 * tries + i for i in range(tries)]


def port_is_free(port: int) -> bool:
    """Whether nothing listens on `port` here. SO_REUSEADDR as torch's TCPStore binds: a port
    whose last connections linger in TIME_WAIT (runs started back to back) is free for it."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def rendezvous_port(job_id: str | None) -> int:
    """The first free port of this job's range, on this host (the first node, MASTER_ADDR)."""
    candidates = rendezvous_ports(job_id, os.getpid())
    for port in candidates:
        if port_is_free(port):
            return port
    raise LaunchError(f"no free rendezvous port on {socket.gethostname()} among {candidates}")


def master_address(allocation: Allocation, interface: str | None, here: str,
                   addresses: list[tuple[str, str]]) -> str:
    """MASTER_ADDR: the first node of the allocation (where rank 0 runs). With a network
    setting, and the driver on that node as the batch script is, its address on that network:
    the node's name may resolve to another one."""
    first = allocation.host_names[0]
    if interface and here.split(".")[0] == first.split(".")[0]:
        return address_for(interface, addresses)
    return first


def stop_grace(signal_seconds: int) -> float:
    """How long ranks get to save and exit after a forwarded stop: most of the signal's lead,
    leaving 15 s to requeue before Slurm's kill; at least 15 s, for the agreement (every 5
    steps), the save and the exit: 8 s from a stop early in a start on a loaded node, in CI."""
    return max(15.0, signal_seconds - 15.0)


def _in_slurm_allocation(environ) -> bool:
    return environ.get("SUBMITIT_EXECUTOR") != "local" and "SLURM_JOB_NODELIST" in environ


def job_allocation(spec: JobSpec, environ) -> Allocation:
    """Every host of this job (slurm.spare_nodes included), or this host outside Slurm."""
    if _in_slurm_allocation(environ):
        return allocation_from_slurm(environ)
    return local_allocation(socket.gethostname(), spec.world_size)


def current_allocation(spec: JobSpec, environ, lost=frozenset()) -> tuple[Allocation, JobSpec]:
    """The hosts the ranks run on, and the spec they train with there. Under Slurm: the job's
    first slurm.nodes hosts that have not died (slurm.nodes a range: as many as are alive, down
    to its minimum); the spec fitted to their number (fit_to_nodes: the run goes on by samples)."""
    allocation, fitted = job_allocation(spec, environ), spec
    if _in_slurm_allocation(environ):
        try:
            allocation = training_hosts(allocation, spec.slurm.nodes, lost, spec.slurm.min_nodes)
            fitted = fit_to_nodes(spec, len(allocation.hosts))
        except (ValueError, SpecError) as exc:
            raise LaunchError(str(exc)) from None
    if allocation.world_size != fitted.world_size:
        raise LaunchError(f"the allocation has {allocation.world_size} slots "
                          f"({allocation.hosts}) but the spec asks for {fitted.world_size} ranks")
    return allocation, fitted


def under_slurm(environ) -> bool:
    return environ.get("SUBMITIT_EXECUTOR") != "local" and "SLURM_JOB_ID" in environ


def planned_end(spec: JobSpec, environ, started: float) -> float | None:
    """When Slurm will end this job, as known at its start (None outside Slurm): Slurm's own end
    time where it can be had, else our start plus the limit (an upper bound)."""
    if not under_slurm(environ):
        return None
    return scheduler.job_end_time(scheduler.job_ref(environ), environ) or started + spec.time_seconds


def stop_deadline(spec: JobSpec, end: float | None) -> float | None:
    """When the ranks must stop by themselves: the job's end minus the signal's lead time (still
    saving before the kill with the upper bound, since the job started before the driver did)."""
    return None if end is None else end - spec.slurm.signal_seconds


def launch_plan(spec: JobSpec, paths: RunPaths, allocation: Allocation, environ,
                deadline: float | None = None, worker: str = WORKER) -> LaunchPlan:
    launch = spec.launch
    if launch.method == "srun" and not under_slurm(environ):
        raise LaunchError("launch.method srun needs a Slurm allocation; outside Slurm (--local) "
                          "use --set launch.method=mpirun")
    program = "srun" if launch.method == "srun" else "mpiexec" if launch.mpi == "mpich" else "mpirun"
    path = shutil.which(program)
    if path is None:
        raise LaunchError(f"{program} is not on PATH in the job: add your MPI or Slurm module to "
                          "slurm.setup")
    env = {
        "MASTER_ADDR": master_address(allocation, launch.network_interface, socket.gethostname(),
                                      ipv4_addresses() if launch.network_interface else []),
        "MASTER_PORT": str(rendezvous_port(environ.get("SLURM_JOB_ID"))),
        STALL_ENV: str(launch.stall_seconds),
        START_ENV: str(launch.start_seconds),
        RANK_LOGS_ENV: str(rank_logs_mode(spec.log.rank_logs, spec.world_size)),
        # One value per start of the ranks: a node's ranks recognise this start's local copy.
        LAUNCH_ID_ENV: f"{environ.get('SLURM_JOB_ID', 'local')}-"
                       f"{environ.get('SLURM_RESTART_COUNT', '0')}-{os.getpid()}-{time.time():.3f}",
        **horovod_env(spec.parallel.horovod, paths, int(environ.get("SLURM_RESTART_COUNT") or 0)),
        **(few_core_env(spec.parallel.horovod, spec.slurm.cpus_per_task, launch.mpi)
           if spec.parallel.backend == "horovod" else {}),
        **launch.env,
    }
    if launch.network_interface:
        env[NETWORK_ENV] = launch.network_interface
    if under_slurm(environ):
        env[NODES_ENV] = str(len(allocation.hosts))
    if deadline is not None:
        env[DEADLINE_ENV] = f"{deadline:.0f}"
    return LaunchPlan(
        flavour=launch.mpi, allocation=allocation, env=env,
        worker=[sys.executable, "-m", worker, str(paths.root)],
        extra_args=launch.extra_args, inherit=inherited(environ),
        as_root=os.geteuid() == 0, mpirun=path, method=launch.method, pmi=launch.pmi,
        cpus_per_task=spec.slurm.cpus_per_task, network_interface=launch.network_interface)


def run_driver(run_dir: str | Path) -> Decision:
    """Start the ranks, watch them, then finish, fail, requeue the job or start the ranks again
    in it (launch.restarts_in_job); returns what it did last."""
    paths = RunPaths(Path(run_dir))
    environ = dict(os.environ)
    package = Path(hpc_train.__file__).parent
    if problem := environment.code_problem(environ, paths.code, package):
        raise LaunchError(problem)
    spec = load_spec(paths.spec)
    hosts = job_allocation(spec, environ).host_names
    end = planned_end(spec, environ, time.time())
    deadline = stop_deadline(spec, end)
    lost: frozenset[str] = frozenset()
    # The handlers stay until the outcome is recorded: our own requeue makes Slurm SIGTERM this
    # process at once, and the default action would end it before the `requeued` event.
    forwarder = StopForwarder()
    sentinel = start_sentinel(spec, environ, forwarder)
    try:
        for index in itertools.count():
            launch = Launch(index, deadline, end, hosts, lost)
            decision, ended = run_ranks(paths, spec, environ, forwarder, launch)
            if decision.action != "restart":
                return decision
            lost = launch.lost_with(ended.node_fault)
    finally:
        if sentinel is not None:
            sentinel.close()
        forwarder.restore()


def start_sentinel(spec: JobSpec, environ, forwarder: StopForwarder) -> Sentinel | None:
    """The preemption sentinel step (sentinel.py), where nothing else of ours would hear a
    preemption's grace start: under Slurm with mpirun (srun's ranks are a step and hear it).
    A step that cannot start costs only that: the grace is then heard at its end, as before."""
    if not under_slurm(environ) or spec.launch.method != "mpirun" or not spec.launch.preemption_sentinel:
        return None
    argv = sentinel_argv(sys.executable, environ.get("SLURMD_NODENAME"))
    try:
        return Sentinel(argv, forwarder.preempted, env=environ)
    except OSError as exc:
        log.warning("could not start the preemption sentinel (%s): a preemption's grace is heard "
                    "at its end only", exc)
        return None


@dataclass(frozen=True)
class Launch:
    """One start of the ranks in this job: which (0, then k after the k-th restart in it); the
    job's stop deadline and planned end (None outside Slurm); every host of the job, and those
    that died under an earlier start (the ranks go on without them, on a spare)."""
    index: int
    deadline: float | None
    end: float | None
    hosts: tuple[str, ...] = ()
    lost: frozenset[str] = frozenset()

    def lost_with(self, fault: NodeFault | None) -> frozenset[str]:
        """The hosts lost so far, the fault's included."""
        return self.lost | frozenset(fault.nodes if fault else ())

    def spare_hosts(self, nodes: int, fault: NodeFault | None) -> int:
        """Hosts left beyond the `nodes` the ranks need, once the fault's are lost too (< 0:
        too few to go on in the job)."""
        gone = self.lost_with(fault)
        return sum(host not in gone for host in self.hosts) - nodes


def run_ranks(paths: RunPaths, spec: JobSpec, environ, forwarder: StopForwarder,
              launch: Launch) -> tuple[Decision, Ended]:
    """Start the ranks once, supervise them, and decide and carry out what follows."""
    started, cpu_before = time.time(), time.process_time()
    allocation, fitted = current_allocation(spec, environ, launch.lost)
    plan = launch_plan(fitted, paths, allocation, environ, launch.deadline)
    argv = launch_argv(plan)
    _record_environment(paths, environ, plan, package=Path(hpc_train.__file__).parent)
    events.try_record(paths, events.started(list(allocation.host_names), allocation.world_size,
                                            launch.deadline, argv, spec.launch.stall_seconds,
                                            launch.index, spec.launch.start_seconds))
    log.info("starting %d ranks: %s", allocation.world_size, " ".join(argv))
    process = subprocess.Popen(argv, env=launcher_env(plan, environ), stderr=subprocess.PIPE,
                               text=True, errors="replace")
    output = LauncherOutput(process.stderr)
    forwarder.follow(process)
    watch = Watch(paths, allocation.world_size, spec.launch.stall_seconds,
                  stop_grace(spec.slurm.signal_seconds), time.time(), plan.method,
                  spec.launch.straggler_warn, launch.end, spec.launch.start_seconds)
    returncode, stall = supervise(process, forwarder, watch)
    if forwarder.reason:
        events.try_record(paths, events.stop_requested(forwarder.reason, forwarder.source))
    fault = None
    saved_stop = events.stop_reason_since(events.read(paths), started)
    # A signal to the job's steps (a preemption's grace, the time limit's end) ends Open MPI's
    # daemons on the other nodes, a step of their own: mpirun then reports a lost daemon of a
    # node that lives. A stop the driver heard, or the ranks saved, is no node's death (and the
    # probe's scontrol calls would spend the seconds left for the requeue).
    if (returncode != 0 or stall) and forwarder.reason is None and saved_stop is None:
        fault = lost_node(returncode, output.tail(), allocation, environ)
    if fault is not None:
        events.try_record(paths, events.node_lost(list(fault.nodes), fault.why))
    # process_time: every thread of this process (the watchdog's included), not the ranks.
    ended = Ended(returncode, round(time.time() - started, 1), stall.why if stall else None,
                  forwarder.reason, fault, time.process_time() - cpu_before,
                  stall_standing=stall.standing if stall else Standing.TRAINING,
                  saved_stop=saved_stop)
    decision = conclude(paths, spec, environ, started, launch, ended)
    log.info("ranks exited %d: %s (%s)", returncode, decision.action, decision.reason)
    return decision, ended


def lost_node(returncode: int, lines: list[str], allocation: Allocation, environ) -> NodeFault | None:
    """Whether a node of the allocation died under the ranks (node_fault.py): from the
    launcher's last lines and, under Slurm, its view of the nodes and whether their slurmd
    still answers."""
    if not under_slurm(environ):
        return node_fault(returncode, lines, {})
    hosts = list(allocation.host_names)
    gone = scheduler.unreachable_nodes(hosts)
    if hosts[0] in gone:     # the batch host, where this driver runs: the probe proves nothing
        gone = []
    return node_fault(returncode, lines, scheduler.node_states(hosts) or {}, tuple(gone))


def _record_environment(paths: RunPaths, environ, plan: LaunchPlan, package: Path) -> None:
    """This start's line of environment.jsonl: a failed write is logged, the job goes on."""
    log.info("code: %s", package)
    try:
        environment.record(paths, environment.job_record(environ, plan.rank_env, package))
    except OSError as exc:
        log.warning("could not record the environment in %s: %s", paths.environment, exc)


def conclude(paths: RunPaths, spec: JobSpec, environ, started: float, launch: Launch,
             ended: Ended) -> Decision:
    """Decide from how the ranks ended and the run state (retries spent), then carry it out."""
    restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
    checkpoint = spec.checkpoint
    # The ranks' saved stop (an event, read into `ended`) words the outcome, and makes it a stop
    # whatever status the launcher reports (srun SIGKILLs the last ranks of a stopping step).
    state = run_state.read(paths)
    decision = decide(ended, stop_words(ended.signal, ended.saved_stop), Budget(
        requeues=restart, max_requeues=checkpoint.max_requeues, failed_runs=state.failed_runs(),
        retries_on_failure=checkpoint.retries_on_failure, restarts_in_job=launch.index,
        max_restarts_in_job=spec.launch.restarts_in_job,
        node_failures=state.retries.get(events.CAUSE_NODE, 0),
        max_node_failures=checkpoint.retries_on_node_failure,
        spare_hosts=launch.spare_hosts(spec.slurm.fewest_nodes, ended.node_fault),
        can_requeue=under_slurm(environ)))
    if decision.action == "restart":
        return _restart(decision, paths, launch.index + 1, spec.launch.restarts_in_job, ended)
    lost = launch.lost_with(ended.node_fault)
    stop = stop_kind(ended.signal, ended.saved_stop) if decision.cause in events.STOP_CAUSES or \
        decision.action == "stopped" else None
    return _carry_out(decision, paths, environ, restart, launch.end, ended, tuple(sorted(lost)), stop)


def _restart(decision: Decision, paths: RunPaths, attempt: int, budget: int,
             ended: Ended) -> Decision:
    """Count the restart in the run state and record it; the caller starts the ranks again.
    A count that cannot be written is logged only: this driver bounds its own restarts."""
    try:
        run_state.update(paths, lambda state: state.with_restart_in_job(decision.cause))
    except OSError as exc:
        log.warning("could not count the restart in %s: %s", paths.run_state, exc)
    events.try_record(paths, events.restarted(decision.reason, decision.cause, attempt, budget,
                                              ended.returncode, ended.seconds))
    return decision


def _count_retry(paths: RunPaths, cause: str | None) -> str | None:
    """Count a failure's, a stall's or a node failure's retry in the run state before it is
    taken: None, or why it cannot be (then it is not taken: the job would retry past its budget)."""
    if cause not in (*events.FAILURE_CAUSES, events.CAUSE_NODE):
        return None
    try:
        run_state.update(paths, lambda state: state.with_retry(cause))
    except OSError as exc:
        return f"the retry could not be counted in {paths.run_state}: {exc}"
    return None


def _carry_out(decision: Decision, paths: RunPaths, environ, restart: int, end: float | None,
               ended: Ended, lost: tuple[str, ...] = (), stop: str | None = None) -> Decision:
    """Requeue when decided and Slurm agrees (a retry counted first); record what really happens.
    end: the job's planned end, to tell a time limit from a cancel when Slurm ends it; lost: the
    nodes that died under this job, which the requeued job is kept off; stop: what asked for the
    stop that ended the ranks, if one did (counted in the run state, recorded in the event)."""
    returncode, seconds = ended.returncode, ended.seconds
    if stop is not None:
        _count_stop(paths, stop)
    if decision.action == "requeue":
        job_id = scheduler.job_ref(environ)   # a sweep member requeues its own task, never the array
        path = requeue_path(scheduler.show_job(job_id), restart)
        detail = "Slurm requeued the job already"
        if path != "ending" and (problem := _count_retry(paths, decision.cause)):
            decision = Decision("failed", f"{decision.reason}; but {problem}")
        elif path == "driver":
            path, detail = scheduler.requeue(job_id, restart)
            if path is None:
                decision = Decision("failed", f"{decision.reason}; but scontrol requeue failed: "
                                              f"{detail}. Continue with `python -m hpc_train "
                                              f"resume {paths.root}`")
        elif path == "ending":
            # Not Slurm's end time now: a cancel sets it to the moment of the cancel.
            status = ending_status(time.time(), end)
            events.try_record(paths, events.finished(status, f"{decision.reason}; not requeued: "
                                                     "Slurm is ending the job", returncode, seconds,
                                                     ended.driver_cpu_seconds, stop))
            return Decision("stopped", f"{decision.reason}; Slurm ended the job ({status})")
        if decision.action == "requeue":
            if lost:
                detail += "; " + _exclude(job_id, lost)
            events.try_record(paths, events.requeued(decision.reason, decision.cause, path, detail,
                                                     returncode, seconds, ended.driver_cpu_seconds,
                                                     stop))
            return decision
    events.try_record(paths, events.finished(decision.action, decision.reason, returncode, seconds,
                                             ended.driver_cpu_seconds, stop))
    return decision


def _count_stop(paths: RunPaths, kind: str) -> None:
    """The run state counts stops by what asked for them; a count that cannot be written is
    logged only (no decision reads it)."""
    try:
        run_state.update(paths, lambda state: state.with_stop(kind))
    except OSError as exc:
        log.warning("could not count the %s stop in %s: %s", kind, paths.run_state, exc)


def _exclude(job_id: str, nodes: tuple[str, ...], tries: int = 6) -> str:
    """Keep the requeued job off the dead nodes. Slurm takes ExcNodeList only once the job is
    pending again, and ends this process soon after the requeue (KillWait): a few quick tries.
    A job that Slurm keeps COMPLETING on a dead node until SlurmdTimeout is requeued by Slurm
    after it, with the node marked down."""
    for _ in range(tries):
        problem = scheduler.exclude_nodes(job_id, list(nodes))
        if problem is None:
            return f"excluded {','.join(nodes)} (ExcNodeList)"
        time.sleep(0.5)
    return f"could not exclude {','.join(nodes)}: {problem}"


def _exit_status(decision: Decision) -> int:
    return {"completed": 0, "requeue": 0, "stopped": STOP_EXIT}.get(decision.action, 1)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(levelname)s %(message)s")


def main(argv: list[str] | None = None) -> int:
    """`python -m hpc_train.job.driver RUN_DIR`: the rendered sbatch script's entry point."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_train.job.driver RUN_DIR", file=sys.stderr)
        return 2
    _setup_logging()
    return _exit_status(run_driver(args[0]))


class Driver:
    """The callable submitit's local executor pickles (no Slurm, no batch script); it only
    carries the run directory."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = str(run_dir)

    def __call__(self) -> str:
        _setup_logging()
        decision = run_driver(self.run_dir)
        if decision.action in ("failed", "stopped"):
            raise LaunchError(f"{decision.action}: {decision.reason}; see {self.run_dir}/logs/")
        return decision.action


if __name__ == "__main__":
    raise SystemExit(main())
