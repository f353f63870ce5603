"""Precision helper on the CPU: fp16 autocast + GradScaler, bf16 autocast, fp32 no-ops."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

from hpc_train.train.precision import Precision


def _problem(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    return model, x, y


def _train_step(prec, model, opt, x, y, max_norm=1.0, **hooks):
    with prec.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    prec.backward(loss)
    norm = prec.unscale_and_clip(opt, max_norm, synchronize=hooks.get("synchronize"))
    applied = prec.step(opt, **hooks)
    prec.update()
    opt.zero_grad(set_to_none=True)
    return loss.item(), norm, applied


@pytest.mark.parametrize("mode", ["fp16", "bf16", "fp32"])
def test_tiny_model_trains_and_loss_decreases(mode):
    model, x, y = _problem()
    prec = Precision(mode, torch.device("cpu"), init_scale=2.0 ** 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    results = [_train_step(prec, model, opt, x, y) for _ in range(15)]
    losses = [r[0] for r in results]
    assert all(r[2] for r in results)  # no overflow at a modest scale
    assert all(torch.isfinite(r[1]) for r in results)
    assert losses[-1] < 0.8 * losses[0]


def _inf_grad_step(prec, model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with prec.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    prec.backward(loss)
    model[0].weight.grad[0, 0] = float("inf")
    before = copy.deepcopy(model.state_dict())
    norm = prec.unscale_and_clip(opt, 1.0)
    applied = prec.step(opt)
    after = copy.deepcopy(model.state_dict())
    prec.update()
    opt.zero_grad(set_to_none=True)  # a skipped step must still drop its grads
    return applied, norm, before, after


def test_inf_gradient_skips_step_and_halves_dynamic_scale():
    model, x, y = _problem()
    prec = Precision("fp16", torch.device("cpu"), init_scale=1024.0)
    applied, norm, before, after = _inf_grad_step(prec, model, x, y)
    assert applied is False
    assert not torch.isfinite(norm)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert prec.loss_scale == 512.0
    # The next clean step goes through.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _train_step(prec, model, opt, x, y)[2] is True


def test_static_loss_scale_skips_inf_but_keeps_scale():
    model, x, y = _problem()
    prec = Precision("fp16", torch.device("cpu"), loss_scale=128.0)
    applied, _, before, after = _inf_grad_step(prec, model, x, y)
    assert applied is False
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert prec.loss_scale == 128.0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        assert _train_step(prec, model, opt, x, y)[2] is True
    assert prec.loss_scale == 128.0


def test_dynamic_scale_grows_after_growth_interval():
    model, x, y = _problem()
    prec = Precision("fp16", torch.device("cpu"), init_scale=64.0, growth_interval=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        _train_step(prec, model, opt, x, y)
    assert prec.loss_scale == 128.0


def test_unscaled_grad_norm_matches_fp32():
    """unscale_and_clip returns the true (unscaled) norm, and clipping uses it."""
    model, x, y = _problem()
    ref = copy.deepcopy(model)
    nn.functional.cross_entropy(ref(x), y).backward()
    expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf"))

    prec = Precision("fp16", torch.device("cpu"), init_scale=2.0 ** 12)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec.backward(nn.functional.cross_entropy(model(x), y))  # no autocast: only scaling
    norm = prec.unscale_and_clip(opt, max_norm=expected.item() / 2)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-5)
    clipped = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert clipped.item() == pytest.approx(expected.item() / 2, rel=1e-4)
    assert prec.unscale_and_clip(opt, None) is None  # second call: no double unscale


@pytest.mark.parametrize("mode,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_matmul_dtype(mode, dtype):
    prec = Precision(mode, torch.device("cpu"))
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with prec.autocast():
        assert torch.mm(a, b).dtype == dtype
    assert torch.mm(a, b).dtype == torch.float32


def test_bf16_and_fp32_have_no_scaler():
    for mode in ("bf16", "fp32"):
        prec = Precision(mode, "cpu")
        assert prec.scaler.is_enabled() is False
        assert prec.loss_scale == 1.0


def test_fp32_is_a_no_op_path():
    prec = Precision("fp32", torch.device("cpu"))
    assert prec.enabled is False
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with prec.autocast():  # also switches off an outer autocast
            assert torch.mm(a, b).dtype == torch.float32
    model, x, y = _problem()
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    _train_step(prec, model, opt, x, y, max_norm=None)
    nn.functional.cross_entropy(ref(x), y).backward()
    ref_opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    state = prec.state_dict()
    Precision("fp32").load_state_dict(state)  # round-trips without a scaler


def test_scaler_state_round_trip_restores_scale():
    model, x, y = _problem()
    prec = Precision("fp16", torch.device("cpu"), init_scale=1024.0, growth_interval=3)
    _inf_grad_step(prec, model, x, y)            # 1024 -> 512
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _train_step(prec, model, opt, x, y)          # growth tracker 1
    state = prec.state_dict()
    assert state["scaler"]["scale"] == 512.0 and state["scaler"]["_growth_tracker"] == 1

    resumed = Precision("fp16", torch.device("cpu"))  # default init_scale 65536
    resumed.load_state_dict(state)
    assert resumed.loss_scale == 512.0
    opt2 = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):                            # tracker 1 -> 3 = growth_interval
        _train_step(resumed, model, opt2, x, y)
    assert resumed.loss_scale == 1024.0


def test_checkpoint_without_scaler_leaves_fresh_scale():
    prec = Precision("fp16", "cpu", init_scale=256.0)
    prec.load_state_dict(Precision("bf16").state_dict())
    assert prec.loss_scale == 256.0


def test_horovod_style_hooks_called_once_and_step_inside_skip_context():
    """The trainer passes optimizer.synchronize / optimizer.skip_synchronize (Horovod)."""
    events = []

    @contextlib.contextmanager
    def skip_sync():
        events.append("enter")
        yield
        events.append("exit")

    model, x, y = _problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    real_step = opt.step
    opt.step = lambda *a, **k: (events.append("step"), real_step(*a, **k))[1]
    prec = Precision("fp16", "cpu", init_scale=256.0)
    hooks = dict(synchronize=lambda: events.append("sync"), skip_sync_context=skip_sync)
    for max_norm in (1.0, None):  # with and without clipping
        events.clear()
        assert _train_step(prec, model, opt, x, y, max_norm=max_norm, **hooks)[2] is True
        assert events == ["sync", "enter", "step", "exit"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        Precision("fp8")
    for bad in ("static", 0, -1.0, True):
        with pytest.raises(ValueError, match="loss_scale"):
            Precision("fp16", loss_scale=bad)
