"""DDP's compression hooks on a one-rank Gloo world, measured in a process of its own.

Gloo runs a hook's future callbacks on its own threads. When such a thread drops the last
reference to the process group, the group's destructor joins that same thread, and libstdc++
aborts the process ("Resource deadlock avoided"): in CI this took down a pytest-xdist worker
with every test queued on it. So the world lives and dies in a spawned child (`measure`), which
returns plain tensors and numbers; the tests assert on them in the parent.
"""

from __future__ import annotations

import io
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch


def in_child() -> dict:
    """`measure()` in a fresh spawned interpreter; its results."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(measure).result(timeout=600)


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


def half_precision() -> dict:
    out = {"plain": _steps(_ddp_model("none")[0], 1)[0]}
    for compression in ("fp16", "bf16"):
        model, state = _ddp_model(compression)
        out[compression] = (state is None, _steps(model, 1)[0])
    return out


def powersgd_after_plain_steps() -> tuple[list, list]:
    model, _ = _ddp_model("powersgd", rank=1, start_step=2)
    plain, _ = _ddp_model("none")
    return _steps(model, 4), _steps(plain, 4)


def powersgd_round_trip() -> dict:
    model, state = _ddp_model("powersgd", rank=1, start_step=2)
    _steps(model, 4)
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    out = {"saved_iter": saved["iter"], "iter": state.state.iter, "saved_errors": len(saved["error_dict"])}
    # Resumed: a new model at the same weights with the saved state trains on as the first.
    again, again_state = _ddp_model("powersgd", rank=1, start_step=2)
    again.load_state_dict(model.state_dict())
    again_state.load_state_dict(saved)
    out["again_iter"] = again_state.state.iter
    out["again_last"], out["first_last"] = _steps(again, 3, seed=7)[-1], _steps(model, 3, seed=7)[-1]
    # The same state saved at another world size: a fresh start.
    _, fresh = _ddp_model("powersgd", rank=1, start_step=2)
    fresh.load_state_dict({**state.state_dict(), "world_size": 2})
    out["fresh_iter"], out["fresh_errors"] = fresh.state.iter, len(fresh.state.error_dict)
    return out


def powersgd_bytes() -> tuple[int, int]:
    """Bytes passed to allreduce in the third step (two plain steps, then compressed), on the
    smoke job's ResNet at the spec's default rank: (plain DDP's, PowerSGD's)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from hpc_train.models import build_model
    from hpc_train.parallel import ddp_hooks
    from hpc_train.spec.schema import PowerSgdSpec

    sent = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    def bytes_of_a_step(compression: str) -> int:
        torch.manual_seed(0)
        model = DistributedDataParallel(build_model("resnet_tiny", 10),
                                        **ddp_hooks.bucket_options(compression))
        if compression == "none":       # DDP's own allreduce is C++; its hook twin calls dist's
            model.register_comm_hook(None, default_hooks.allreduce_hook)
        ddp_hooks.register(model, compression, PowerSgdSpec(start_step=2), world_size=1)
        for _ in range(3):
            sent.clear()
            model(torch.randn(4, 3, 32, 32)).sum().backward()
        return sum(sent)

    dist.all_reduce = counting
    try:
        return bytes_of_a_step("none"), bytes_of_a_step("powersgd")
    finally:
        dist.all_reduce = real


def measure() -> dict:
    import torch.distributed as dist

    from hpc_train.launch.local import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        return {"half": half_precision(), "powersgd": powersgd_after_plain_steps(),
                "round_trip": powersgd_round_trip(), "bytes": powersgd_bytes()}
    finally:
        dist.barrier()
        dist.destroy_process_group()
