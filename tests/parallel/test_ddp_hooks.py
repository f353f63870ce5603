"""DDP's gradient compression: which backend runs which (the spec's one table), the hooks on a
one-rank Gloo world, and PowerSGD's state through a checkpoint (plain tensors, weights_only).

Real runs (mpirun, 2 ranks): tests/parallel/test_powersgd_runs.py.
"""

from __future__ import annotations

import io

import pytest
import torch

from hpc_train.spec import spec_from_dict
from hpc_train.spec.compression_rules import COMPRESSIONS
from hpc_train.spec.problems import SpecInvalid
from hpc_train.spec.rules import check_spec
from hpc_train.launch.local import free_port

BASE = {"run": {"name": "t"}, "data": {"kind": "synthetic"}}


def errors_of(*overrides: str) -> list[str]:
    try:
        errors, _ = check_spec(spec_from_dict(BASE, list(overrides)))
    except SpecInvalid as exc:       # errors stop the load already
        return [str(p) for p in exc.problems]
    return [str(e) for e in errors]


@pytest.mark.parametrize("backend", ["horovod", "ddp", "fsdp"])
@pytest.mark.parametrize("compression", ["none", "fp16", "bf16", "powersgd"])
def test_each_backend_runs_the_compressions_of_its_row_and_refuses_the_rest(backend, compression):
    errors = errors_of(f"parallel.backend={backend}", f"parallel.compression={compression}")
    if compression in COMPRESSIONS.get(backend, ("none",)):
        assert errors == []
    else:
        (error,) = errors
        assert error.startswith(f"parallel.compression: '{compression}' with parallel.backend "
                                f"'{backend}' is not allowed") and "Fix: " in error
        # The fix names the backends that do run it.
        runs_it = [b for b, kinds in COMPRESSIONS.items() if compression in kinds]
        assert all(b in error.split("Fix: ")[1] for b in runs_it), error


def test_powersgd_settings_without_powersgd_are_a_warning():
    spec = spec_from_dict(BASE, ["parallel.backend=ddp", "parallel.powersgd.rank=8"])
    _, warnings = check_spec(spec)
    assert [w.key for w in warnings] == ["parallel.powersgd"]


def test_powersgd_needs_two_plain_steps_first():
    with pytest.raises(Exception, match="parallel.powersgd.start_step"):
        spec_from_dict(BASE, ["parallel.powersgd.start_step=1"])


@pytest.fixture(scope="module")
def one_rank_world():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _ddp_model(compression: str, **powersgd):
    from torch.nn.parallel import DistributedDataParallel

    from hpc_train.parallel import ddp_hooks
    from hpc_train.spec.schema import PowerSgdSpec

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 8)),
                                    **ddp_hooks.bucket_options(compression))
    state = ddp_hooks.register(model, compression, PowerSgdSpec(**powersgd), world_size=1)
    return model, state


def _steps(model, count: int, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for _ in range(count):
        x = torch.randn(16, 32, generator=generator)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        grads.append(model.module[0].weight.grad.clone())
        optimizer.step()
    return grads


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_half_precision_hooks_round_the_gradients_as_their_dtype(one_rank_world, compression):
    model, state = _ddp_model(compression)
    plain, _ = _ddp_model("none")
    assert state is None
    got, expected = _steps(model, 1)[0], _steps(plain, 1)[0]
    dtype = torch.float16 if compression == "fp16" else torch.bfloat16
    assert torch.equal(got, expected.to(dtype).to(torch.float32))
    assert not torch.equal(got, expected)


def test_powersgd_compresses_after_its_plain_steps(one_rank_world):
    model, _ = _ddp_model("powersgd", rank=1, start_step=2)
    plain, _ = _ddp_model("none")
    got, expected = _steps(model, 4), _steps(plain, 4)
    assert torch.equal(got[0], expected[0])        # plain allreduce first
    assert not torch.equal(got[3], expected[3])    # then rank-1 factors (and error feedback)


def test_powersgd_state_round_trips_through_a_weights_only_checkpoint(one_rank_world):
    model, state = _ddp_model("powersgd", rank=1, start_step=2)
    _steps(model, 4)
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    assert saved["iter"] == state.state.iter and saved["error_dict"]

    # Resumed: a new model at the same weights with the saved state trains on as the first.
    again, again_state = _ddp_model("powersgd", rank=1, start_step=2)
    again.load_state_dict(model.state_dict())
    again_state.load_state_dict(saved)
    assert again_state.state.iter == state.state.iter
    assert torch.equal(_steps(again, 3, seed=7)[-1], _steps(model, 3, seed=7)[-1])


def test_powersgd_state_of_another_world_size_starts_afresh(one_rank_world):
    model, state = _ddp_model("powersgd", rank=1, start_step=2)
    _steps(model, 4)
    saved = {**state.state_dict(), "world_size": 2}
    _, fresh = _ddp_model("powersgd", rank=1, start_step=2)
    fresh.load_state_dict(saved)
    assert fresh.state.iter == 0 and fresh.state.error_dict == {}


def test_powersgd_sends_a_quarter_of_the_bytes_or_fewer(one_rank_world, monkeypatch):
    """Counted at the allreduce calls, on the smoke job's ResNet (the spec's default rank)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hpc_train.models import build_model
    from hpc_train.parallel import ddp_hooks
    from hpc_train.spec.schema import PowerSgdSpec

    sent = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", counting)

    def bytes_of_a_step(compression: str) -> int:
        torch.manual_seed(0)
        model = DistributedDataParallel(build_model("resnet_tiny", 10),
                                        **ddp_hooks.bucket_options(compression))
        if compression == "none":       # DDP's own allreduce is C++; its hook twin calls dist's
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.allreduce_hook)
        ddp_hooks.register(model, compression, PowerSgdSpec(start_step=2), world_size=1)
        for _ in range(3):          # two plain steps, then compressed
            sent.clear()
            model(torch.randn(4, 3, 32, 32)).sum().backward()
        return sum(sent)

    plain, compressed = bytes_of_a_step("none"), bytes_of_a_step("powersgd")
    print(f"[bytes] resnet_tiny per step: allreduce {plain}, powersgd {compressed} ({plain / compressed:.1f}x fewer)")
    assert plain > 4 * compressed > 0, (plain, compressed)
