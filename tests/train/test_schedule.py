"""LR schedule: plain numbers in, plain numbers out (no optimizer except for `apply`)."""

from __future__ import annotations

import math

import pytest

from hpc_train.spec.schema import scale_lr
from hpc_train.train.schedule import LrSchedule, lr_at

N = 1000  # samples per epoch (the training set)


def _kw(**over):
    kw = dict(peak_lr=0.4, epoch_samples=N, warmup_epochs=5, total_epochs=90, schedule="cosine")
    kw.update(over)
    return kw


def test_scale_lr_linear_rule():
    assert scale_lr(0.1, 256) == pytest.approx(0.1)
    assert scale_lr(0.1, 8192) == pytest.approx(3.2)  # Goyal et al.: k=256 GPUs x 32
    assert scale_lr(0.1, 64) == pytest.approx(0.025)
    assert scale_lr(0.1, 1024, reference_batch=512) == pytest.approx(0.2)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="samples_per_step"):
            scale_lr(0.1, bad)
    with pytest.raises(ValueError, match="base_lr"):
        scale_lr(0.0, 256)


def test_the_spec_scales_its_lr_with_this_rule(monkeypatch):
    from hpc_train.spec import schema, spec_from_dict

    spec = spec_from_dict({"run": {"name": "t"}, "data": {"batch_size": 64},
                           "slurm": {"tasks_per_node": 2}, "parallel": {"accumulation": 2}})
    assert spec.scaled_lr == scale_lr(spec.optim.base_lr, 256) == pytest.approx(0.1)
    monkeypatch.setattr(schema, "scale_lr", lambda base_lr, samples: ("rule", base_lr, samples))
    assert spec.scaled_lr == ("rule", 0.1, 64 * 2 * 2)     # one function, not a copy


@pytest.mark.parametrize("schedule", ["cosine", "step", "constant"])
def test_warmup_is_linear_in_samples_and_reaches_peak(schedule):
    kw = _kw(schedule=schedule, milestones=(30, 60, 80))
    warm = [lr_at(s, **kw) for s in range(100, 5 * N + 1, 100)]
    assert all(b > a for a, b in zip(warm, warm[1:]))
    assert lr_at(1, **kw) == pytest.approx(0.4 / (5 * N))       # never 0
    assert lr_at(64, **kw) == pytest.approx(0.4 * 64 / 5000)    # first step of 64: 1/W of peak
    assert lr_at(2500, **kw) == pytest.approx(0.2)
    assert lr_at(5 * N, **kw) == pytest.approx(0.4)             # warmup's end is peak


def _steps(total: int, per_step: int, start: int = 0) -> list[int]:
    """Positions reached by steps of `per_step` samples from `start` (one epoch, no tail)."""
    return list(range(start + per_step, total + 1, per_step))


@pytest.mark.parametrize("schedule", ["cosine", "step", "constant"])
def test_the_lr_at_a_position_is_the_same_for_any_global_batch(schedule):
    """A run at 64 samples per step and one resumed at 32 or 128 (or any world size) train at
    the same LR wherever their steps reach the same position."""
    kw = _kw(schedule=schedule, warmup_epochs=2, total_epochs=8, milestones=(3, 6))
    straight = {p: lr_at(p, **kw) for p in _steps(8 * N, 64)}
    for per_step in (32, 128, 192):
        resumed = {p: lr_at(p, **kw) for p in _steps(8 * N, per_step, start=64 * 40)}
        shared = straight.keys() & resumed.keys()
        assert len(shared) > 10
        assert all(resumed[p] == straight[p] for p in shared)


@pytest.mark.parametrize("schedule", ["cosine", "step", "constant"])
def test_continuous_at_warmup_boundary(schedule):
    kw = _kw(schedule=schedule, milestones=(30, 60))
    w = 5 * N
    before, at, after = (lr_at(s, **kw) for s in (w - 1, w, w + 1))
    per_sample = 0.4 / w
    assert abs(at - before) <= per_sample * 1.0001
    assert abs(after - at) <= per_sample


def test_cosine_half_way_and_ends_at_zero():
    kw = _kw(warmup_epochs=0, total_epochs=10)
    total = 10 * N
    assert lr_at(1, **kw) == pytest.approx(0.4)
    assert lr_at(total // 2, **kw) == pytest.approx(0.2)
    assert lr_at(total - 10, **kw) < 0.4 * 1e-5
    assert lr_at(total, **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(total + 50, **kw) == pytest.approx(0.0, abs=1e-12)  # clamps, never rises
    values = [lr_at(s, **kw) for s in range(1, total + 1, 7)]
    assert all(b <= a for a, b in zip(values, values[1:]))


def test_cosine_after_warmup_formula():
    kw = _kw()
    w, total = 5 * N, 90 * N
    s = w + (total - w) // 4
    expected = 0.4 * 0.5 * (1 + math.cos(math.pi * (s - w) / (total - w)))
    assert lr_at(s, **kw) == pytest.approx(expected)


def test_step_milestones_multiply_by_gamma_after_their_epoch_begins():
    kw = _kw(schedule="step", milestones=(30, 60, 80), gamma=0.1)
    assert lr_at(30 * N, **kw) == pytest.approx(0.4)      # a step ending at the milestone
    assert lr_at(30 * N + 1, **kw) == pytest.approx(0.04)
    assert lr_at(60 * N, **kw) == pytest.approx(0.04)
    assert lr_at(60 * N + 64, **kw) == pytest.approx(0.004)
    assert lr_at(80 * N + 64, **kw) == pytest.approx(0.0004)
    assert lr_at(500 * N, **kw) == pytest.approx(0.0004)


def test_fractional_epochs_are_samples():
    kw = _kw(schedule="step", warmup_epochs=0.5, milestones=(1.25,), gamma=0.5)
    assert lr_at(500, **kw) == pytest.approx(0.4)   # warmup is 500 samples
    assert lr_at(499, **kw) < 0.4
    assert lr_at(1250, **kw) == pytest.approx(0.4)
    assert lr_at(1251, **kw) == pytest.approx(0.2)


def test_constant_and_no_warmup():
    kw = _kw(schedule="constant", warmup_epochs=0)
    assert [lr_at(s, **kw) for s in (1, 2, 500, 10_000)] == [0.4] * 4


@pytest.mark.parametrize("over,match", [
    (dict(schedule="linear"), "schedule must be one of"),
    (dict(peak_lr=0), "peak_lr"),
    (dict(epoch_samples=0), "epoch_samples"),
    (dict(warmup_epochs=100), "warmup_epochs"),
    (dict(schedule="step"), "needs milestones"),
    (dict(schedule="step", milestones=(60, 30)), "strictly increasing"),
    (dict(schedule="step", milestones=(5, 30)), "after warmup_epochs"),
])
def test_bad_settings_raise_with_rule(over, match):
    with pytest.raises(ValueError, match=match):
        lr_at(1, **_kw(**over))
    with pytest.raises(ValueError, match=match):
        LrSchedule(**_kw(**over))


def test_a_position_before_any_sample_is_rejected():
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="position"):
            lr_at(bad, **_kw())


class _FakeOptimizer:
    def __init__(self):
        self.param_groups = [{"lr": 0.0}, {"lr": 0.0, "lr_scale": 10.0}]


def test_lr_schedule_apply_sets_every_group():
    sched = LrSchedule(**_kw())
    opt = _FakeOptimizer()
    lr = sched.apply(opt, 2500)
    assert lr == pytest.approx(lr_at(2500, **_kw())) == pytest.approx(0.2)
    assert opt.param_groups[0]["lr"] == pytest.approx(lr)
    assert opt.param_groups[1]["lr"] == pytest.approx(10 * lr)
