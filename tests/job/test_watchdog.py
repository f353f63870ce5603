"""The driver's watchdog (pure rules on heartbeats and a fake clock) and the ranks' heartbeat."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from hpc_train.job import watchdog
from hpc_train.job.watchdog import Beat, Standing, find_stall, stop_ignored
from hpc_train.runtime.heartbeat import STACK_DUMP_HEADER, Heartbeat, Phase, beat_interval
from tests.runs import wait_for

LAUNCH = 1000.0
STALL = 60.0
INTERVAL = beat_interval(STALL)


def beat(rank, step, progress, alive, phase="train", began=None):
    return Beat(rank, step, phase, progress, alive, pid=100 + rank, host=f"node{rank}",
                first_step_time=began)


def test_no_stall_while_any_rank_progresses():
    beats = {0: beat(0, 5, 1100.0, 1100.0), 1: beat(1, 5, 1050.0, 1100.0)}
    assert find_stall(beats, 2, LAUNCH, 1101.0, STALL, INTERVAL) is None


def test_start_up_counts_from_the_launch():
    assert find_stall({}, 2, LAUNCH, LAUNCH + STALL - 1, STALL, INTERVAL) is None
    stall = find_stall({}, 2, LAUNCH, LAUNCH + STALL, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [0, 1]
    assert all("no heartbeat" in r.why and r.idle_seconds == STALL for r in stall.ranks)


def test_a_frozen_rank_is_the_culprit_not_the_ranks_waiting_for_it():
    now = 1200.0
    beats = {0: beat(0, 21, 1100.0, now - 1), 1: beat(1, 20, 1099.0, 1099.5), 2: beat(2, 21, 1100.0, now - 2)}
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [(r.rank, r.host, r.pid, r.step) for r in stall.ranks] == [(1, "node1", 101, 20)]
    assert "not running" in stall.ranks[0].why
    assert "launch.stall_seconds=60" in stall.why


def test_alive_ranks_behind_the_others_are_named():
    now = 1200.0
    beats = {0: beat(0, 21, 1100.0, now), 1: beat(1, 20, 1098.0, now), 2: beat(2, 21, 1100.0, now)}
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [1] and "behind" in stall.ranks[0].why


def test_all_alive_at_one_step_names_every_rank():
    now = 1200.0
    beats = {r: beat(r, 21, 1100.0, now) for r in range(2)}
    stall = find_stall(beats, 2, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [0, 1] and "same step" in stall.ranks[0].why


def test_a_stop_not_obeyed_within_the_grace_period():
    beats = {0: beat(0, 3, 1100.0, 1100.0, began=1050.0)}    # training before the stop
    assert stop_ignored(beats, 1, 1109.0, 1100.0, 10.0, INTERVAL, LAUNCH) is None
    stall = stop_ignored(beats, 1, 1110.0, 1100.0, 10.0, INTERVAL, LAUNCH)
    assert "did not stop within 10 s" in stall.why
    assert stall.standing is Standing.TRAINING


@pytest.mark.parametrize("ranks, standing", [
    # Both training before the stop (at 1100), and not stopped: deaf to it, a failure.
    ({0: ("train", 1090.0), 1: ("sync", 1091.0)}, Standing.TRAINING),
    ({0: ("checkpoint", 1090.0), 1: ("checkpoint", 1090.0)}, Standing.TRAINING),  # a save hangs
    ({0: ("stopping", 1090.0), 1: ("checkpoint", 1090.0)}, Standing.TRAINING),    # 1 still saves
    # The stop came before every rank began training: still starting, or just past it when the
    # grace ran out (their first steps, or saving the stop), they had less than the grace.
    ({0: ("starting", None), 1: ("resuming", None)}, Standing.STARTING),
    ({0: ("network", None)}, Standing.STARTING),                 # rank 1 has not beaten yet
    ({0: ("data", 1099.0)}, Standing.STARTING),                  # ... and rank 0 began in time
    ({0: ("starting", None), 1: ("data", 1098.0)}, Standing.STARTING),
    ({0: ("data", 1098.0), 1: ("data", 1114.0)}, Standing.STARTING),
    ({0: ("checkpoint", 1104.0), 1: ("checkpoint", 1105.0)}, Standing.STARTING),
    # Every rank saved the stop and is exiting: nothing is lost, whenever they began.
    ({0: ("stopping", 1090.0), 1: ("stopping", 1090.0)}, Standing.EXITING),
    ({0: ("stopping", 1105.0), 1: ("stopping", 1106.0)}, Standing.EXITING),
])
def test_a_stop_not_obeyed_says_where_the_ranks_stood(ranks, standing):
    beats = {r: beat(r, 0, 1110.0, 1115.0, phase, began) for r, (phase, began) in ranks.items()}
    stall = stop_ignored(beats, 2, 1120.0, 1100.0, 15.0, INTERVAL, LAUNCH)
    assert stall.standing is standing
    assert ("while they still started" in stall.why) is (standing is Standing.STARTING)
    assert ("saved it and were exiting" in stall.why) is (standing is Standing.EXITING)


def test_a_stall_of_ranks_that_saved_their_stop_is_their_exit():
    beats = {r: beat(r, 9, 1100.0, 1200.0, "stopping") for r in range(2)}
    stall = find_stall(beats, 2, LAUNCH, 1200.0, STALL, INTERVAL)
    assert stall.standing is Standing.EXITING and "exiting" in stall.why
    beats[1] = beat(1, 9, 1100.0, 1200.0, "checkpoint")
    assert find_stall(beats, 2, LAUNCH, 1200.0, STALL, INTERVAL).standing is Standing.TRAINING


def test_the_beat_says_when_the_rank_began_training(tmp_path):
    now = [1000.0]
    heartbeat = Heartbeat(tmp_path / "beat", 0, stall_seconds=60, clock=lambda: now[0])
    heartbeat.write()
    assert watchdog.parse_beat((tmp_path / "beat").read_text()).first_step_time is None
    now[0] = 1010.0
    heartbeat.progress(step=41, phase=Phase.DATA)       # resumed at step 41
    now[0] = 1020.0
    heartbeat.progress(step=42, phase=Phase.DATA)
    heartbeat.write()
    beat_read = watchdog.parse_beat((tmp_path / "beat").read_text())
    assert (beat_read.step, beat_read.first_step_time) == (42, 1010.0)
    assert watchdog.began_training({0: beat_read}, 1) == 1010.0
    assert watchdog.began_training({0: beat_read}, 2) is None


@pytest.mark.slow
def test_a_beat_counts_the_threads_beats(tmp_path):
    """`beat`: the thread's beats so far, what a node's writes are counted against
    (tests/e2e/test_node_writes_e2e.py); the writes at the start and at a phase change are none."""
    path = tmp_path / "beat"
    counted, two = [], threading.Event()

    def after_beat():      # the node writer's tick: the beat just written is on disk
        counted.append(json.loads(path.read_text())["beat"])
        if len(counted) == 2:
            two.set()
    heartbeat = Heartbeat(path, 0, stall_seconds=10, after_beat=after_beat)     # 1 s apart
    heartbeat.write()
    heartbeat.progress(step=1, phase=Phase.TRAIN)       # a phase change writes at once
    assert json.loads(path.read_text())["beat"] == 0
    heartbeat.start()
    try:
        assert two.wait(60), counted
    finally:
        heartbeat.close()
    assert counted[:2] == [1, 2] and json.loads(path.read_text())["beat"] == len(counted)


def test_beats_of_an_earlier_run_are_ignored(tmp_path):
    for rank, written in ((0, 900.0), (1, 1001.0)):
        record = {"rank": rank, "host": "h", "pid": 1, "step": 3, "phase": "train",
                  "progress": written, "time": written}
        (tmp_path / f"rank-{rank:05d}").write_text(json.dumps(record))
    (tmp_path / ".rank-00002.tmp").write_text("{")
    assert list(watchdog.read_beats(tmp_path, since=LAUNCH)) == [1]


def test_process_state_of_this_process():
    import os

    assert watchdog.process_state(os.getpid()).startswith(("R", "S"))
    assert watchdog.process_state(None) is None


@pytest.mark.slow
def test_heartbeat_thread_writes_and_dumps_stacks_once_when_stuck(tmp_path, capfd):
    path = tmp_path / "rank-00003"
    beats: list[int] = []
    heartbeat = Heartbeat(path, 3, stall_seconds=5, after_beat=lambda: beats.append(1))
    asked: list[int] = []                                   # the beats so far, at each dump
    heartbeat.after_dump = lambda: asked.append(len(beats))   # the trainer's: its workers
    heartbeat.start()                                                # writes every second
    try:
        heartbeat.progress(step=7, phase=Phase.TRAIN)
        wait_for(lambda: asked, 60, "the stuck rank's stack dump")
        # Two beats more, still silent: a dump at every beat would have come with the first.
        wait_for(lambda: len(beats) >= asked[0] + 2, 60, "two more beats")
        dumped = capfd.readouterr().err
        record = json.loads(path.read_text())
    finally:
        heartbeat.close()
    assert "on rank 3 at step 7 (phase train)" in dumped     # the phase's word, in the log
    assert len(asked) == 1 and dumped.count(STACK_DUMP_HEADER) == 1   # once per silence
    assert (record["rank"], record["step"], record["phase"]) == (3, 7, "train")   # and on disk
    assert record["time"] >= record["progress"]


@pytest.mark.slow
def test_heartbeat_dump_contains_the_main_threads_stack(tmp_path):
    import subprocess

    # Stuck until the heartbeat has dumped the stacks and beaten twice more (a second dump, were
    # there one, would have come with the first of those).
    code = ("import time; from pathlib import Path; from hpc_train.runtime.heartbeat import Heartbeat\n"
            "beats, dumped = [], []\n"
            "h = Heartbeat(Path(r'%s'), 0, stall_seconds=4, after_beat=lambda: beats.append(1))\n"
            "h.after_dump = lambda: dumped.append(len(beats))\n"
            "h.progress(step=1)\n"     # training: stall_seconds holds, not the start-up bound
            "h.start()\n"
            "def stuck_in_a_collective():\n"
            "    while not dumped or len(beats) < dumped[0] + 2:\n"
            "        time.sleep(0.1)\n"
            "stuck_in_a_collective(); h.close()\n") % (tmp_path / "rank-00000")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert STACK_DUMP_HEADER in out.stderr and "stuck_in_a_collective" in out.stderr
    assert out.stderr.count(STACK_DUMP_HEADER) == 1


def test_a_rank_in_an_earlier_phase_of_the_same_step_is_the_one_waited_for():
    now = 1200.0
    beats = {0: beat(0, 12, 1100.0, now, "sync"), 1: beat(1, 12, 1099.0, now, "train"),
             2: beat(2, 12, 1100.0, now, "sync")}
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [1] and "phase train of step 12" in stall.ranks[0].why
    beats[1] = beat(1, 12, 1099.0, now, "data")                     # stuck fetching its batch
    beats[0] = beat(0, 12, 1100.0, now, "train")                    # waiting in the all-reduce
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [1]


@pytest.mark.parametrize("stop_at, standing", [(1012.0, Standing.STARTING),   # before they trained
                                               (1045.0, Standing.TRAINING)])  # after: deaf to it
def test_the_driver_ends_ranks_deaf_to_a_stop_and_says_where_they_stood(tmp_path, stop_at, standing):
    """Real heartbeats, the driver's reading of them, a fake clock: the ranks resume, train from
    1020 on, and never stop."""
    from types import SimpleNamespace

    from hpc_train.job.supervise import Watch
    from hpc_train.rundir import RunPaths

    paths = RunPaths(tmp_path)
    now = [1010.0]
    hearts = [Heartbeat(paths.heartbeat / f"rank-{r:05d}", r, STALL, clock=lambda: now[0])
              for r in range(2)]
    watch = Watch(paths, 2, STALL, grace=15.0, launched=LAUNCH)
    forwarder = SimpleNamespace(at=None)
    step = 7
    while True:
        for heart in hearts:
            if now[0] < 1020.0:
                heart.progress(phase=Phase.RESUMING)
            else:
                heart.progress(step=step, phase=Phase.DATA)
            heart.write()
        forwarder.at = stop_at if now[0] >= stop_at else None
        if (stall := watch.stall(forwarder, now[0])) is not None:
            break
        assert now[0] < stop_at + 15.0 + INTERVAL
        now[0] += INTERVAL
        step += 1
    assert stall.standing is standing and now[0] >= stop_at + 15.0


def test_the_driver_gives_start_up_its_own_bound_then_the_stall_bound(tmp_path):
    """Real heartbeats, a fake clock: ranks importing for minutes on a loaded node are starting,
    not stalled, until launch.start_seconds; once both trained, launch.stall_seconds holds."""
    from types import SimpleNamespace

    from hpc_train.job.supervise import Watch
    from hpc_train.rundir import RunPaths

    paths = RunPaths(tmp_path)
    now = [LAUNCH]
    hearts = [Heartbeat(paths.heartbeat / f"rank-{r:05d}", r, STALL, clock=lambda: now[0],
                        start_seconds=300.0) for r in range(2)]
    watch = Watch(paths, 2, STALL, grace=15.0, launched=LAUNCH, start_seconds=300.0)
    idle = SimpleNamespace(at=None)

    def first_stall() -> float:
        while watch.stall(idle, now[0]) is None:
            now[0] += INTERVAL
            for heart in hearts:
                heart.write()      # alive, never progressing
        return now[0]

    assert first_stall() >= LAUNCH + 300.0        # 60 s alone would have ended it
    assert not any(heart._bound() == STALL for heart in hearts)   # their own stack dumps agree
    watch = Watch(paths, 2, STALL, grace=15.0, launched=now[0], start_seconds=300.0)
    began = now[0]
    for heart in hearts:
        heart.progress(step=1, phase=Phase.DATA)
    assert began + STALL <= first_stall() < began + 300.0
    assert all(heart._bound() == STALL for heart in hearts)


def test_a_rank_frozen_before_its_first_step_is_a_stall_not_a_slow_start(tmp_path):
    """Rank 1 stops beating (SIGSTOP, its node dead) while rank 0 starts: launch.stall_seconds
    holds, not launch.start_seconds."""
    from types import SimpleNamespace

    from hpc_train.job.supervise import Watch
    from hpc_train.rundir import RunPaths

    paths = RunPaths(tmp_path)
    now = [LAUNCH]
    hearts = [Heartbeat(paths.heartbeat / f"rank-{r:05d}", r, STALL, clock=lambda: now[0],
                        start_seconds=300.0) for r in range(2)]
    for heart in hearts:
        heart.write()
    watch = Watch(paths, 2, STALL, grace=15.0, launched=LAUNCH, start_seconds=300.0)
    while (stall := watch.stall(SimpleNamespace(at=None), now[0])) is None:
        now[0] += INTERVAL
        hearts[0].write()                                  # rank 1 writes no more
    assert now[0] < LAUNCH + 300.0 and "launch.stall_seconds=60" in stall.why
    assert [r.rank for r in stall.ranks] == [1] and "not running" in stall.ranks[0].why


def test_the_driver_judges_an_unobeyed_stop_on_the_newest_beats(tmp_path):
    """The beats are read once per interval; the judgement reads them again: ranks that wrote
    `stopping` since the last read are exiting, not deaf."""
    from types import SimpleNamespace

    from hpc_train.job.supervise import Watch
    from hpc_train.rundir import RunPaths

    paths = RunPaths(tmp_path)
    now = [1020.0]
    hearts = [Heartbeat(paths.heartbeat / f"rank-{r:05d}", r, STALL, clock=lambda: now[0])
              for r in range(2)]
    for heart in hearts:
        heart.progress(step=7, phase=Phase.DATA)
        heart.write()
    watch = Watch(paths, 2, STALL, grace=15.0, launched=LAUNCH)
    forwarder = SimpleNamespace(at=1030.0)
    now[0] = 1044.0
    assert watch.stall(forwarder, now[0]) is None                   # read: still training
    now[0] = 1045.0
    for heart in hearts:
        heart.progress(phase=Phase.STOPPING)                        # wrote at once
    stall = watch.stall(forwarder, 1046.0)                          # within the interval
    assert stall.standing is Standing.EXITING


@pytest.mark.parametrize("phases, now, ends", [
    (("stopping", "stopping"), 1186.0, True),     # saved, 14 s before the end: end them
    (("stopping", "stopping"), 1184.0, False),    # 16 s before: the launcher may still return
    (("stopping", "checkpoint"), 1199.0, False),  # rank 1 still saves: nothing may be lost
])
def test_ranks_that_saved_their_stop_are_ended_near_the_jobs_end(phases, now, ends):
    beats = {r: beat(r, 9, 1180.0, 1180.0, phase) for r, phase in enumerate(phases)}
    stall = watchdog.out_of_time(beats, 2, now, 1200.0, 15.0, LAUNCH)
    assert (stall is not None) is ends
    if ends:
        assert stall.standing is Standing.EXITING and "before the job's end" in stall.why
        assert [r.pid for r in stall.ranks] == [100, 101]
    assert watchdog.out_of_time(beats, 2, now, None, 15.0, LAUNCH) is None   # outside Slurm


RANK_EXITING_SLOWLY = """
import sys, time
from pathlib import Path
from hpc_train.runtime.heartbeat import Heartbeat, Phase
for r in range(2):
    Heartbeat(Path(sys.argv[1]) / f"rank-{r:05d}", r, 60.0).progress(step=9, phase=Phase.STOPPING)
print("saved", flush=True)
time.sleep(600)
"""


def test_the_driver_leaves_a_launcher_that_outlasts_the_saved_stop(tmp_path):
    """Real processes: a launcher that never returns, and a rank on this host that saved its
    stop (its beats say so) but does not exit. Near the job's end the driver kills both and
    says why; what follows is a stop, not a stall (Standing.EXITING: requeue.decide)."""
    import subprocess
    import time
    from types import SimpleNamespace

    from hpc_train.job.supervise import REQUEUE_SECONDS, Watch, supervise
    from hpc_train.rundir import RunPaths

    paths = RunPaths(tmp_path)
    paths.heartbeat.mkdir(parents=True)
    rank = subprocess.Popen([sys.executable, "-c", RANK_EXITING_SLOWLY, str(paths.heartbeat)],
                            stdout=subprocess.PIPE, text=True)
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert rank.stdout.readline() == "saved\n"
        watch = Watch(paths, 2, STALL, grace=15.0, launched=time.time() - 30,
                      end=time.time() + REQUEUE_SECONDS + 2)
        returncode, stall = supervise(launcher, SimpleNamespace(at=None), watch)
        assert rank.wait(timeout=60) == -9
    finally:
        for process in (launcher, rank):
            process.kill()
            process.wait()
    assert returncode == -9
    assert stall.standing is Standing.EXITING and "before the job's end" in stall.why
    assert [e["standing"] for e in map(json.loads, paths.events.read_text().splitlines())
            if e["event"] == "ranks_stalled"] == ["exiting"]
