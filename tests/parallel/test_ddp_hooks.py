"""DDP's gradient compression: which backend runs which (the spec's one table), the hooks on a
one-rank Gloo world, and PowerSGD's state through a checkpoint (plain tensors, weights_only).

Real runs (mpirun, 2 ranks): tests/parallel/test_powersgd_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from hpc_train.spec import spec_from_dict
from hpc_train.spec.compression_rules import COMPRESSIONS
from hpc_train.spec.problems import SpecInvalid
from hpc_train.spec.rules import check_spec

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
def measured() -> dict:
    """Every hook measurement of the module, made once in a spawned child (one_rank_world.py
    says why not in this process)."""
    from tests.parallel import one_rank_world

    return one_rank_world.in_child()


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_half_precision_hooks_round_the_gradients_as_their_dtype(measured, compression):
    no_state, got = measured["half"][compression]
    expected = measured["half"]["plain"]
    assert no_state
    dtype = torch.float16 if compression == "fp16" else torch.bfloat16
    assert torch.equal(got, expected.to(dtype).to(torch.float32))
    assert not torch.equal(got, expected)


def test_powersgd_compresses_after_its_plain_steps(measured):
    got, expected = measured["powersgd"]
    assert torch.equal(got[0], expected[0])        # plain allreduce first
    assert not torch.equal(got[3], expected[3])    # then rank-1 factors (and error feedback)


def test_powersgd_state_round_trips_through_a_weights_only_checkpoint(measured):
    trip = measured["round_trip"]
    assert trip["saved_iter"] == trip["iter"] and trip["saved_errors"]
    # Resumed: a new model at the same weights with the saved state trains on as the first.
    assert trip["again_iter"] == trip["iter"]
    assert torch.equal(trip["again_last"], trip["first_last"])


def test_powersgd_state_of_another_world_size_starts_afresh(measured):
    trip = measured["round_trip"]
    assert trip["fresh_iter"] == 0 and trip["fresh_errors"] == 0


def test_powersgd_sends_a_quarter_of_the_bytes_or_fewer(measured):
    """Counted at the allreduce calls, on the smoke job's ResNet (the spec's default rank)."""
    plain, compressed = measured["bytes"]
    print(f"[bytes] resnet_tiny per step: allreduce {plain}, powersgd {compressed} ({plain / compressed:.1f}x fewer)")
    assert plain > 4 * compressed > 0, (plain, compressed)
