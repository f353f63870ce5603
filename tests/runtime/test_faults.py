"""The test-only pace fault: every rank sleeps the same time in every step (runtime/faults.py)."""

from __future__ import annotations

import pytest

from hpc_train.runtime import faults


def test_pace_sleeps_in_every_step_of_every_rank(monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    for rank in (0, 3):
        injector = faults.FaultInjector(rank, {faults.FAULT_ENV: "pace:0.25"})
        for step in (1, 2, 40):
            injector.at_step(step)
        injector.during_write(2)            # a checkpoint's write is not paced
    assert slept == [0.25] * 6


@pytest.mark.parametrize("text", ["pace", "pace:1:0.5", "pace:-1", "pace:fast"])
def test_a_malformed_pace_is_refused_with_the_forms(text):
    with pytest.raises(ValueError, match="pace:SECONDS"):
        faults.parse_fault(text)


def test_pace_parses_to_every_rank():
    assert faults.parse_fault("pace:0.4") == faults.Fault("pace", rank=-1, step=0, seconds=0.4)
