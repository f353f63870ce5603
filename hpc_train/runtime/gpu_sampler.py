"""GPU utilisation and memory on a node, sampled through NVML for `report`.

Rank 0 of each node starts one sampler thread when the NVML binding (`pynvml`, from the
nvidia-ml-py package) imports and sees a GPU; elsewhere nothing is started and nothing is
written, and `report` says that nothing was sampled. One JSON line per GPU every `interval`
seconds (30 by default: a few KB an hour) goes to `gpu/<host>.jsonl` in the run directory.

Only the job's own GPUs are sampled: those Slurm names in SLURM_JOB_GPUS / SLURM_STEP_GPUS
(NVML indices), or CUDA_VISIBLE_DEVICES when it lists NVML indices or UUIDs; all of them when
none is set (a machine of one's own).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from hpc_train.rundir import append_jsonl

log = logging.getLogger("hpc_train.gpu_sampler")
INTERVAL = 30.0


def load_nvml():
    """The initialised pynvml module when it imports and sees at least one GPU, else None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() > 0:
            return pynvml
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no binding, no driver, no GPU: all mean "do not sample"
        pass
    return None


def job_devices(environ: Mapping[str, str], count: int) -> list[int | str]:
    """Which devices belong to this job: NVML indices, or UUIDs (GPU-...) as CUDA names them."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(name)
        if value is None:
            continue
        items = [item.strip() for item in value.split(",") if item.strip()]
        if items and all(item.isdigit() for item in items):
            return [int(item) for item in items if int(item) < count]
        if items and all(item.startswith(("GPU-", "MIG-")) for item in items):
            return items
    return list(range(count))


def sample(nvml, devices: list[int | str], host: str, now: float) -> list[dict]:
    """One record per device: utilisation (% of the last sample period) and memory in bytes."""
    records = []
    for device in devices:
        if isinstance(device, str):
            handle = nvml.nvmlDeviceGetHandleByUUID(device)
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(device)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        records.append({"time": now, "host": host, "gpu": device,
                        "util": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                        "mem_used": int(memory.used), "mem_total": int(memory.total)})
    return records


class GpuSampler:
    """A daemon thread appending samples to `path` until `close`."""

    def __init__(self, nvml, path: Path, devices: list[int | str], interval: float = INTERVAL,
                 host: str | None = None):
        self.nvml, self.path, self.devices, self.interval = nvml, path, devices, interval
        self.host = host or socket.gethostname()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    def start(self) -> GpuSampler:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def sample_once(self) -> None:
        for record in sample(self.nvml, self.devices, self.host, time.time()):
            append_jsonl(self.path, record)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - sampling must never end the rank
                log.warning("GPU sampling stopped: %s", exc)
                return
            self._stop.wait(self.interval)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def start_sampler(path: Path, environ: Mapping[str, str], local_rank: int,
                  interval: float = INTERVAL) -> GpuSampler | None:
    """On a node's first rank with NVML and a GPU: a started sampler writing to `path`."""
    if local_rank != 0:
        return None
    nvml = load_nvml()
    if nvml is None:
        return None
    devices = job_devices(environ, nvml.nvmlDeviceGetCount())
    log.info("sampling GPUs %s every %g s into %s", devices, interval, path)
    return GpuSampler(nvml, path, devices, interval).start()
