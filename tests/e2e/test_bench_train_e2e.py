"""`bench train --submit` on the CI cluster: one Slurm job runs every configuration of a matrix
(2 CPU ranks, resnet_tiny, a few steps) and writes the report; each row ran what it names, as the
ranks themselves recorded it. Timing is reported, never asserted.

CI runs the default matrix without fp16 precision and without gradient compression (autocast
in fp16 is about 10x slower than fp32 on a CPU: its rows were most of the job's time; the
compressed rows doubled the rest); the whole default matrix with --heavy. fp16 precision itself
is trained in CI by tests/e2e/test_submit_e2e.py and resumed exactly, with fp16 compression, by
tests/train/test_resume_exact.py; PowerSGD by tests/parallel/test_powersgd_runs.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpc_train.bench import train_plan
from tests.conftest import heavy_params
from tests.runs import cli, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

TINY = ("--set", "data.image_size=16", "--set", "data.batch_size=8", "--set", "data.workers=1",
        "--warmup", "1", "--steps", "2", "--rounds", "1", "--allreduce-model", "resnet_tiny",
        "--allreduce-repetitions", "2", "--allreduce-rounds", "2", "--time", "5")
DATA_KIND = {"synthetic": "synthetic", "real": "hdf5"}


def _ended(cluster, job_id: str) -> str:
    return cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"},
                              timeout=240)


# The precisions and compressions a matrix runs (--precisions, --compressions; the default's
# when None).
MATRICES = {"fp32": (("fp32",), ("none",)), "default": (None, None)}


@pytest.mark.parametrize("matrix", heavy_params(list(MATRICES), {"default"}))
def test_bench_train_submit_reports_every_configuration_of_the_matrix(matrix, slurm_cluster, tmp_path):
    precisions, compressions = MATRICES[matrix]
    chosen = (*(("--precisions", ",".join(precisions)) if precisions else ()),
              *(("--compressions", ",".join(compressions)) if compressions else ()))
    out = cli("bench", "train", "jobs/smoke.yaml", "--submit", "--set", f"run.root={tmp_path}",
              "--set", "parallel.horovod.cycle_time_ms=2", *TINY, *chosen)
    assert out.returncode == 0, out.stderr
    job_id = re.search(r"^job id:\s+(\d+)$", out.stdout, re.M).group(1)
    slurm_cluster.job_ids.append(job_id)
    root = Path(re.search(r"^bench dir:\s+(.+)$", out.stdout, re.M).group(1))
    assert str(root / "report.md") in out.stdout
    state = _ended(slurm_cluster, job_id)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in [root / "bench.out", *root.glob("logs/*.log")]
                     if p.is_file())
    assert state == "COMPLETED", logs
    report = json.loads(wait_for(lambda: (root / "report.json").is_file() and (root / "report.json").read_text(),
                                 10, "report.json"))

    asked = train_plan.Matrix(**{key: value for key, value in (("precisions", precisions),
                                                               ("compressions", compressions)) if value})
    expected = {c.name for c in train_plan.configurations(asked, 2, train_plan.SpecData(real=True))[0]}
    assert {row["name"] for row in report["rows"]} == expected and report["missing"] == []
    for row in report["rows"]:
        recorded = row["recorded"]
        assert row["ranks_agree"], row["name"]
        assert (recorded["backend"], recorded["precision"], recorded["compression"]) == \
            (row["backend"], row["precision"], row["compression"]), row["name"]
        assert recorded["world_size"] == row["ranks"] and recorded["data"] == DATA_KIND[row["data"]]
        assert row["timed_steps"] == 2 and row["images_per_s"] > 0 and row["peak_memory_bytes"] > 0
        assert set(row["parts_s"]) == {"data", "compute", "comm", "optimizer", "other"}
        # The knob set in the spec reached every Horovod rank, through Slurm and mpirun, with
        # the driver's few-core tuning (one core per rank; the cycle is the spec's).
        assert recorded["horovod_env"] == ({"HOROVOD_CYCLE_TIME": "2", "OMPI_MCA_mpi_yield_when_idle": "1"}
                                           if row["backend"] == "horovod" else {})
        if row["ranks"] == 2:
            assert row["scaling_efficiency"] is not None
    assert {(o["backend"], o["precision"], o["ranks"]) for o in report["overhead"]} == {
        (b, p, n) for b in ("ddp", "horovod") for p in asked.precisions for n in (1, 2)}
    methods = {r["method"]: r for r in report["allreduce"]["rows"]}
    assert {"mpi4py", "horovod gradients", "ddp buckets", "torch.distributed one tensor"} <= set(methods)
    assert methods["mpi4py"]["vs_mpi"] == 1.0 and methods["horovod gradients"]["target"] == 0.9
    assert report["allreduce"]["measured"]["torch_backend"] == "gloo"
    markdown = (root / "report.md").read_text()
    # Horovod and DDP each under each compression and precision, 1 and 2 ranks, 2 data.
    kinds = len(asked.precisions)
    assert markdown.count("\n| trainer ") == 8 * len(asked.compressions) * kinds
    assert markdown.count("\n| bare ") == 4 * kinds
    assert (root / "report.png").stat().st_size > 10_000
    assert "| configuration | ranks | data | images/s |" in (root / "bench.out").read_text()
