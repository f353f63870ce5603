"""A preemption's grace, heard: what asked for a stop (pure), and the sentinel step's program
with the driver's watcher of it (a real process and a real SIGTERM; under Slurm it runs as a
step: tests/e2e/test_preemption_e2e.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from hpc_train import events
from hpc_train.job.requeue import PREEMPTED, stop_kind, stop_words
from hpc_train.job.sentinel import HEARD, Sentinel, sentinel_argv
from hpc_train.job.supervise import StopForwarder
from hpc_train.run_state import RunState, from_events


@pytest.mark.parametrize("driver, ranks, kind", [
    (PREEMPTED, "SIGUSR2", events.STOP_PREEMPTED),      # mpirun: the sentinel heard it, USR2 passed on
    ("SIGUSR2", "SIGUSR2", events.STOP_TIME_LIMIT),     # the --signal=B:USR2 we submit
    (None, "deadline", events.STOP_TIME_LIMIT),         # the ranks' own deadline
    (None, "SIGTERM", events.STOP_PREEMPTED),           # srun: the steps alone were signalled
    ("SIGTERM", "SIGUSR2", events.STOP_SIGNAL),         # the whole job signalled (scancel --full)
    ("SIGTERM", "SIGTERM", events.STOP_SIGNAL),
    (None, "SIGUSR2", events.STOP_SIGNAL),
    (None, None, None),
])
def test_what_asked_for_a_stop(driver, ranks, kind):
    assert stop_kind(driver, ranks) == kind
    words = stop_words(driver, ranks)
    assert ("preempted" in (words or "")) == (kind == events.STOP_PREEMPTED)


def test_stops_are_counted_by_kind_in_the_events_and_the_run_state():
    history = [events.requeued("preempted", events.CAUSE_STOP, "driver", "", 75, 10.0, stop="preempted"),
               events.requeued("SIGUSR2", events.CAUSE_STOP, "driver", "", 75, 10.0, stop="time_limit"),
               events.requeued("failure", events.CAUSE_FAILURE, "driver", "", 1, 10.0),
               events.finished("stopped", "SIGUSR2", 75, 1.0, stop="time_limit")]
    assert events.stops(history) == {"time_limit": 2, "preempted": 1}
    assert from_events(history).stops == {"time_limit": 2, "preempted": 1}
    assert RunState().with_stop("preempted").with_stop("preempted").stops == {"preempted": 2}
    with pytest.raises(ValueError, match="unknown stop kind"):
        events.requeued("x", events.CAUSE_STOP, "driver", "", 75, 1.0, stop="lunch")


def test_the_step_is_one_task_on_the_batch_host_sharing_the_jobs_resources():
    argv = sentinel_argv("/venv/bin/python", "hpcn3")
    assert argv[0] == "srun" and "--overlap" in argv and "--ntasks=1" in argv
    assert "--nodelist=hpcn3" in argv and argv[-3:] == ["-u", "-m", "hpc_train.job.sentinel"]
    assert not any(a.startswith("--nodelist") for a in sentinel_argv("/venv/bin/python", None))


def _program() -> list[str]:
    return [sys.executable, "-u", "-m", "hpc_train.job.sentinel"]


def test_the_sentinel_hears_sigterm_once_and_the_driver_is_told():
    heard = threading.Event()
    sentinel = Sentinel(_program(), heard.set)
    try:
        assert sentinel.ready.wait(60), "the sentinel never said it was ready"
        sentinel.process.send_signal(signal.SIGUSR2)            # not its signal: ignored
        sentinel.process.send_signal(signal.SIGTERM)
        assert heard.wait(60), "the driver was not told"
        assert sentinel.process.wait(60) == 0
    finally:
        sentinel.close()


def test_a_sentinel_ended_by_the_driver_itself_tells_nothing():
    heard = threading.Event()
    sentinel = Sentinel(_program(), heard.set)
    assert sentinel.ready.wait(60)
    sentinel.close()                      # SIGTERM from us: it prints HEARD, which is ignored now
    assert sentinel.process.returncode == 0 and not heard.is_set()


def test_the_sentinels_word_stops_running_ranks_only():
    ranks = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                              "signal.signal(signal.SIGUSR2, lambda *a: sys.exit(75))\n"
                              "print('up', flush=True)\ntime.sleep(120)"],
                             stdout=subprocess.PIPE, text=True)
    forwarder = StopForwarder()
    try:
        forwarder.preempted()                          # no launcher yet: not a stop of the ranks
        assert forwarder.reason is None
        forwarder.follow(ranks)
        assert ranks.stdout.readline() == "up\n"
        forwarder.preempted()
        assert (forwarder.reason, forwarder.source) == (PREEMPTED, "preemption sentinel step")
        assert ranks.wait(60) == 75                    # passed on as the agreed stop's USR2
        forwarder.preempted()                          # heard again: the first reason stands
        assert forwarder.reason == PREEMPTED
    finally:
        forwarder.restore()
        ranks.kill()


def test_heard_is_the_line_the_program_prints():
    out = subprocess.run([sys.executable, "-c", "import os, signal, threading, runpy, sys\n"
                          "threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
                          "sys.argv = ['sentinel']\nrunpy.run_module('hpc_train.job.sentinel', run_name='__main__')"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == HEARD, out
