"""The NVML sampler with a stand-in NVML (this machine has no GPU and no binding): which devices
are the job's, what a sample holds, the file it writes, and when nothing is started."""

from __future__ import annotations

from types import SimpleNamespace

from hpc_train.rundir import read_jsonl
from hpc_train.runtime import gpu_sampler
from tests.runs import wait_for


class FakeNvml:
    """pynvml's calls that the sampler makes, over two GPUs."""

    def __init__(self):
        self.devices = {0: ("GPU-aaaa", 35, 10 * 2 ** 30), 1: ("GPU-bbbb", 90, 70 * 2 ** 30)}
        self.shut = False

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return next(i for i, d in self.devices.items() if d[0] == uuid)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.devices[handle][1], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.devices[handle][2], total=80 * 2 ** 30, free=0)

    def nvmlShutdown(self):
        self.shut = True


def test_only_the_jobs_devices_are_sampled():
    assert gpu_sampler.job_devices({}, 4) == [0, 1, 2, 3]
    assert gpu_sampler.job_devices({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}, 4) == [2, 3]
    assert gpu_sampler.job_devices({"SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "1,2"}, 4) == [1]
    assert gpu_sampler.job_devices({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, 2) == ["GPU-bbbb"]
    assert gpu_sampler.job_devices({"CUDA_VISIBLE_DEVICES": "0,7"}, 2) == [0]     # 7: not on this node


def test_a_sample_per_device_by_index_or_uuid():
    nvml = FakeNvml()
    assert gpu_sampler.sample(nvml, [1, "GPU-aaaa"], "n1", 5.0) == [
        {"time": 5.0, "host": "n1", "gpu": 1, "util": 90, "mem_used": 70 * 2 ** 30, "mem_total": 80 * 2 ** 30},
        {"time": 5.0, "host": "n1", "gpu": "GPU-aaaa", "util": 35, "mem_used": 10 * 2 ** 30,
         "mem_total": 80 * 2 ** 30}]


def test_the_sampler_writes_lines_until_closed(tmp_path):
    nvml = FakeNvml()
    path = tmp_path / "gpu" / "n1.jsonl"
    sampler = gpu_sampler.GpuSampler(nvml, path, [0, 1], interval=0.05, host="n1").start()
    wait_for(lambda: len(read_jsonl(path)) >= 4, 60, f"two samples of both GPUs in {path}")
    sampler.close()
    rows = read_jsonl(path)
    assert len(rows) >= 4 and {r["gpu"] for r in rows} == {0, 1} and nvml.shut
    assert not sampler._thread.is_alive()      # stopped: nothing is left to write another line


def test_nothing_is_started_off_the_first_rank_or_without_nvml(tmp_path, monkeypatch):
    path = tmp_path / "gpu" / "n1.jsonl"
    monkeypatch.setattr(gpu_sampler, "load_nvml", lambda: FakeNvml())
    assert gpu_sampler.start_sampler(path, {}, local_rank=1) is None
    started = gpu_sampler.start_sampler(path, {"CUDA_VISIBLE_DEVICES": "1"}, local_rank=0, interval=60)
    assert started is not None and started.devices == [1]
    started.close()
    monkeypatch.setattr(gpu_sampler, "load_nvml", lambda: None)
    assert gpu_sampler.start_sampler(tmp_path / "other.jsonl", {}, local_rank=0) is None
    assert not (tmp_path / "other.jsonl").exists()


def test_without_the_binding_no_nvml_is_loaded():
    # A CPU machine without nvidia-ml-py, as this one: the rank samples nothing, silently.
    import importlib.util

    import pytest

    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("pynvml is installed here")
    assert gpu_sampler.load_nvml() is None
