"""LR schedule: plain numbers in, plain numbers out (no optimizer except for `apply`)."""

from __future__ import annotations

import math

import pytest

from hpc_train.spec.schema import scale_lr
from hpc_train.train.schedule import LrSchedule, lr_at

SPE = 10  # optimizer steps per epoch


def _kw(**over):
    kw = dict(peak_lr=0.4, steps_per_epoch=SPE, warmup_epochs=5, total_epochs=90,
              schedule="cosine")
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
def test_warmup_monotone_small_start_and_reaches_peak(schedule):
    kw = _kw(schedule=schedule, milestones=(30, 60, 80))
    warm = [lr_at(s, **kw) for s in range(5 * SPE + 1)]
    assert all(b > a for a, b in zip(warm, warm[1:]))
    assert warm[0] == pytest.approx(0.4 / 50)  # default start factor 1 / warmup_steps
    assert warm[-1] == pytest.approx(0.4)       # step == warmup_steps is peak
    assert warm[-2] == pytest.approx(0.4 * (1 / 50 + (49 / 50) * (49 / 50)))


def test_warmup_start_factor_goyal_one_worker():
    kw = _kw(warmup_start_factor=1 / 32)
    assert lr_at(0, **kw) == pytest.approx(0.4 / 32)
    assert lr_at(25, **kw) == pytest.approx(0.4 * (1 / 32 + (31 / 32) * 0.5))
    assert lr_at(50, **kw) == pytest.approx(0.4)


@pytest.mark.parametrize("schedule", ["cosine", "step", "constant"])
def test_continuous_at_warmup_boundary(schedule):
    kw = _kw(schedule=schedule, milestones=(30, 60))
    w = 5 * SPE
    before, at, after = (lr_at(s, **kw) for s in (w - 1, w, w + 1))
    step_size = 0.4 / w  # one warmup increment
    assert abs(at - before) <= step_size * 1.0001
    assert abs(after - at) <= step_size


def test_cosine_half_way_and_ends_at_zero():
    kw = _kw(warmup_epochs=0, total_epochs=10)
    total = 10 * SPE
    assert lr_at(0, **kw) == pytest.approx(0.4)
    assert lr_at(total // 2, **kw) == pytest.approx(0.2)
    assert lr_at(total - 1, **kw) < 0.4 * 1e-3
    assert lr_at(total, **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(total + 50, **kw) == pytest.approx(0.0, abs=1e-12)  # clamps, never rises
    values = [lr_at(s, **kw) for s in range(total + 1)]
    assert all(b <= a for a, b in zip(values, values[1:]))


def test_cosine_after_warmup_formula():
    kw = _kw()
    w, total = 50, 900
    s = w + (total - w) // 4
    expected = 0.4 * 0.5 * (1 + math.cos(math.pi * (s - w) / (total - w)))
    assert lr_at(s, **kw) == pytest.approx(expected)


def test_step_milestones_multiply_by_gamma():
    kw = _kw(schedule="step", milestones=(30, 60, 80), gamma=0.1)
    assert lr_at(299, **kw) == pytest.approx(0.4)
    assert lr_at(300, **kw) == pytest.approx(0.04)
    assert lr_at(599, **kw) == pytest.approx(0.04)
    assert lr_at(600, **kw) == pytest.approx(0.004)
    assert lr_at(800, **kw) == pytest.approx(0.0004)
    assert lr_at(5000, **kw) == pytest.approx(0.0004)


def test_fractional_epochs_round_to_steps():
    kw = _kw(schedule="step", warmup_epochs=0.5, milestones=(1.25,), gamma=0.5)
    assert lr_at(5, **kw) == pytest.approx(0.4)  # warmup is 5 steps
    assert lr_at(4, **kw) < 0.4
    # 1.25 epochs x 10 = 12.5 rounds half up to step 13 (round() would give 12).
    assert lr_at(12, **kw) == pytest.approx(0.4)
    assert lr_at(13, **kw) == pytest.approx(0.2)


def test_constant_and_no_warmup():
    kw = _kw(schedule="constant", warmup_epochs=0)
    assert [lr_at(s, **kw) for s in (0, 1, 500, 10_000)] == [0.4] * 4


@pytest.mark.parametrize("over,match", [
    (dict(schedule="linear"), "schedule must be one of"),
    (dict(peak_lr=0), "peak_lr"),
    (dict(steps_per_epoch=0), "steps_per_epoch"),
    (dict(warmup_epochs=100), "warmup_epochs"),
    (dict(schedule="step"), "needs milestones"),
    (dict(schedule="step", milestones=(60, 30)), "strictly increasing"),
    (dict(schedule="step", milestones=(5, 30)), "after warmup_epochs"),
    (dict(warmup_start_factor=0.0), "warmup_start_factor"),
])
def test_bad_settings_raise_with_rule(over, match):
    with pytest.raises(ValueError, match=match):
        lr_at(0, **_kw(**over))
    with pytest.raises(ValueError, match=match):
        LrSchedule(**_kw(**over))


def test_negative_step_rejected():
    with pytest.raises(ValueError, match="step"):
        lr_at(-1, **_kw())


class _FakeOptimizer:
    def __init__(self):
        self.param_groups = [{"lr": 0.0}, {"lr": 0.0, "lr_scale": 10.0}]


def test_lr_schedule_apply_and_state_round_trip():
    sched = LrSchedule(**_kw())
    assert (sched.warmup_steps, sched.total_steps) == (50, 900)
    opt = _FakeOptimizer()
    lr = sched.apply(opt, 25)
    assert lr == pytest.approx(lr_at(25, **_kw()))
    assert opt.param_groups[0]["lr"] == pytest.approx(lr)
    assert opt.param_groups[1]["lr"] == pytest.approx(10 * lr)
    state = sched.state_dict()
    assert state == {"last_step": 25}

    resumed = LrSchedule(**_kw())
    assert resumed.last_step == -1
    resumed.load_state_dict(state)
    assert resumed.last_step == 25
    assert resumed.lr(resumed.last_step + 1) == pytest.approx(sched.lr(26))
