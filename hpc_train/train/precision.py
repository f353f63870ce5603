"""Mixed precision for one training step: autocast, loss scaling, unscale + clip, step, update.

The training loop reads like nanoGPT's:

    with prec.autocast():
        loss = criterion(model(x), y) / accum_steps
    prec.backward(loss)                       # scaled backward (fp16 only)
    if last micro-batch of the step:
        norm = prec.unscale_and_clip(opt, max_norm)
        applied = prec.step(opt)              # False: inf/nan grads, step skipped
        prec.update()                         # adjust the dynamic scale
        opt.zero_grad(set_to_none=True)

Modes: "fp32" (all no-ops), "bf16" (autocast only: bf16 has fp32's exponent range, so no loss
scaling is needed), "fp16" (autocast plus `torch.amp.GradScaler`).

Loss scale: "dynamic" is GradScaler's usual halve-on-overflow / double-every-`growth_interval`.
A fixed number is still a GradScaler -- a static scale must still SKIP steps whose gradients
overflowed, which a bare `loss * S` does not -- whose scale is reset to the fixed value at every
`update()` (GradScaler refuses backoff_factor=1.0, and resetting keeps it exact).

Horovod. `hvd.DistributedOptimizer` allreduces gradients asynchronously during backward and
waits for them inside `optimizer.step()`. Unscaling or clipping needs the reduced gradients
first, and the step must then not wait again. Horovod's recipe is:

    optimizer.synchronize(); scaler.unscale_(optimizer); clip
    with optimizer.skip_synchronize(): scaler.step(optimizer)

This module does not import horovod; the trainer passes the two hooks instead:

    prec.unscale_and_clip(opt, max_norm, synchronize=opt.synchronize)
    prec.step(opt, synchronize=opt.synchronize, skip_sync_context=opt.skip_synchronize)

`synchronize` is called exactly once per optimizer step (by whichever of the two runs first),
and the optimizer step always runs inside `skip_sync_context()` when one is given. With DDP
(gradients are reduced during backward) or one process, pass neither.

Sharded gradients (fsdp): each rank unscales only its shards, so an inf/nan may show on one
rank alone; `sharded=True` takes torch's ShardedGradScaler, which all-reduces the overflow flag,
so every rank skips the same steps.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch

from hpc_train.spec.schema import DEFAULT_INIT_SCALE

__all__ = ["MODES", "Precision"]

MODES = ("fp32", "fp16", "bf16")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class Precision:
    def __init__(self, mode: str = "fp32", device: torch.device | str = "cpu",
                 loss_scale: str | float = "dynamic", init_scale: float = DEFAULT_INIT_SCALE,
                 growth_interval: int = 2000, sharded: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"precision mode must be one of {MODES}, got {mode!r}")
        if isinstance(loss_scale, str):
            if loss_scale != "dynamic":
                raise ValueError(f"loss_scale must be 'dynamic' or a number > 0, "
                                 f"got {loss_scale!r}")
        elif isinstance(loss_scale, bool) or not float(loss_scale) > 0:
            raise ValueError(f"loss_scale must be 'dynamic' or a number > 0, got {loss_scale!r}")
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
        self.mode = mode
        self.device = torch.device(device)
        self.dtype = _DTYPES[mode]
        # None: dynamic. A float: the fixed scale (init_scale is then irrelevant).
        self.static_scale = None if loss_scale == "dynamic" else float(loss_scale)
        self.scaler = _scaler_class(sharded)(
            self.device.type,
            init_scale=self.static_scale or init_scale,
            growth_interval=growth_interval,
            enabled=(mode == "fp16"))
        # ids of optimizers synchronized + unscaled for the current step; see _prepare.
        self._prepared: set[int] = set()

    @property
    def enabled(self) -> bool:
        """True when autocast is on (fp16 or bf16)."""
        return self.mode != "fp32"

    @property
    def loss_scale(self) -> float:
        """Current loss scale (1.0 when not scaling); for logging."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else 1.0

    def autocast(self) -> ContextManager:
        """Autocast context for the forward pass and loss (not for backward)."""
        if self.mode == "fp32":
            # enabled=False rather than nullcontext: it also switches off an outer autocast.
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """`loss.backward()`, scaled in fp16 mode. Divide by accumulation steps before."""
        self.scaler.scale(loss).backward()

    def _prepare(self, optimizer: torch.optim.Optimizer,
                 synchronize: Callable[[], Any] | None) -> None:
        # Once per step: finish the gradient allreduce, then unscale (GradScaler raises if
        # unscale_ runs twice before update, and Horovod must not synchronize twice).
        if id(optimizer) in self._prepared:
            return
        if synchronize is not None:
            synchronize()
        self.scaler.unscale_(optimizer)  # no-op when disabled
        self._prepared.add(id(optimizer))

    def unscale_and_clip(self, optimizer: torch.optim.Optimizer, max_norm: float | None,
                         *, synchronize: Callable[[], Any] | None = None
                         ) -> torch.Tensor | None:
        """Synchronize (hook), unscale the grads, clip to `max_norm` if given.

        Returns the total grad norm before clipping (inf/nan when the fp16 step will be
        skipped), or None when `max_norm` is None: computing a norm costs a pass over
        every gradient, so only clipping pays for it.
        """
        self._prepare(optimizer, synchronize)
        if max_norm is None:
            return None
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        # foreach=None lets torch pick the fused path; non-finite norms are allowed because
        # the scaler is about to skip that step anyway.
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def step(self, optimizer: torch.optim.Optimizer, *,
             synchronize: Callable[[], Any] | None = None,
             skip_sync_context: Callable[[], ContextManager] | None = None) -> bool:
        """Apply the optimizer step unless fp16 grads hold inf/nan. True if applied.

        fp32 and bf16 always step (no scaler, nothing to detect overflow against).
        """
        self._prepare(optimizer, synchronize)
        with skip_sync_context() if skip_sync_context else contextlib.nullcontext():
            self.scaler.step(optimizer)
        self._prepared.discard(id(optimizer))
        if not self.scaler.is_enabled():
            return True
        # GradScaler records, per device, whether unscale_ found inf/nan; step() skipped the
        # optimizer exactly when one is non-zero. The accessor is private but is the one
        # GradScaler itself uses; step() has already synced these to the host.
        found = self.scaler._found_inf_per_device(optimizer)
        return not any(bool(v.item()) for v in found.values())

    def update(self) -> None:
        """Adjust the loss scale after every optimizer's step (fp16); otherwise a no-op."""
        if self.static_scale is not None:
            self.scaler.update(new_scale=self.static_scale)
        else:
            self.scaler.update()
        self._prepared.clear()

    def state_dict(self) -> dict[str, Any]:
        """Save with the checkpoint, after update(): without it a resumed fp16 run restarts
        from init_scale and skips steps (or underflows) until the scale settles again."""
        return {"mode": self.mode, "static_scale": self.static_scale,
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the dynamic scale and growth tracker.

        Nothing to restore when this run is not dynamic fp16, or when the checkpoint came
        from a run without a scaler (fp32/bf16 -> fp16 starts from init_scale).
        """
        saved = state.get("scaler") or {}
        if self.scaler.is_enabled() and self.static_scale is None and saved:
            self.scaler.load_state_dict(saved)


def _scaler_class(sharded: bool) -> type:
    if not sharded:
        return torch.amp.GradScaler
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler
