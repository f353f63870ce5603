"""uint8 to the device: when workers hand over uint8, where the rank normalises, and that the
uint8 and float paths train the shipped smoke job to the same numbers."""

from __future__ import annotations

import pytest
import torch

from hpc_train.data.transforms import TrainTransform, normalize_batch
from hpc_train.spec import load_spec
from hpc_train.train.data import DeviceInputs, build_loaders, normalizes_on_device
from tests.conftest import REPO
from tests.runs import describe_failure, drive, events, local_run

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)   # device objects: no GPU needed


def _spec(*overrides: str):
    return load_spec(REPO / "jobs/smoke.yaml", list(overrides))


@pytest.mark.parametrize("setting, device, kind, expected", [
    ("auto", CUDA, "hdf5", True),        # the default for GPU jobs
    ("auto", CPU, "hdf5", False),        # CPU jobs normalise in the workers, as before
    ("device", CPU, "hdf5", True),
    ("workers", CUDA, "hdf5", False),
    ("auto", CUDA, "synthetic", False),  # nothing to normalise
])
def test_where_images_are_normalised(setting, device, kind, expected):
    spec = _spec(f"data.normalize_on={setting}", f"data.kind={kind}")
    assert normalizes_on_device(spec, device) is expected


def test_tokens_are_never_normalised():
    spec = load_spec(REPO / "jobs/transformer_pipeline.yaml", ["data.normalize_on=device"])
    assert spec.data.kind in ("text", "tokens")
    assert normalizes_on_device(spec, CUDA) is False


def test_device_inputs_normalise_uint8_like_the_workers():
    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    floats = torch.stack([TrainTransform(16)(pixels, np.random.default_rng(i)) for i in range(4)])
    uint8 = torch.stack([TrainTransform(16, normalize=False)(pixels, np.random.default_rng(i))
                         for i in range(4)])
    labels = torch.arange(4)
    images, got_labels = DeviceInputs(CPU, normalize=True)(uint8, labels)
    assert images.dtype == torch.float32 and torch.equal(images, floats)   # bit for bit on CPU
    assert torch.equal(normalize_batch(uint8), floats) and torch.equal(got_labels, labels)
    assert torch.equal(DeviceInputs(CPU, normalize=True)(floats, labels)[0], floats)
    tokens = torch.randint(0, 256, (2, 8), dtype=torch.uint8)
    assert torch.equal(DeviceInputs(CPU, normalize=False)(tokens, labels)[0], tokens)


def test_loaders_hand_over_uint8_when_asked():
    spec = _spec(f"data.path={REPO / 'data/demo-shards'}", "data.workers=0")
    for uint8, dtype in ((True, torch.uint8), (False, torch.float32)):
        train, val = build_loaders(spec, 0, 1, pin=False, uint8=uint8)
        assert next(iter(train))[0].dtype == dtype
        if val is not None:
            assert next(iter(val))[0].dtype == dtype


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_uint8_and_float_paths_train_the_smoke_job_alike(tmp_path):
    """12 steps of jobs/smoke.yaml (shards, augmentation, 2 workers, Horovod) each way: on CPU
    the very same losses and weights (the same x * a + b arithmetic)."""
    from hpc_train.rundir import read_jsonl

    results = {}
    for where in ("device", "workers"):
        paths = local_run(tmp_path, "optim.max_steps=12", "log.every_steps=1",
                          f"data.normalize_on={where}", name=where)
        assert drive(paths) == 0, describe_failure(paths)
        losses = [m["loss"] for m in read_jsonl(paths.metrics) if m.get("split") is None]
        digests = {e["params_sha256"] for e in events(paths, "rank_finished")}
        assert len(losses) == 12 and len(digests) == 1
        results[where] = (losses, digests.pop())
    assert results["device"] == results["workers"], results
