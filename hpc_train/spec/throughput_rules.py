"""Rules about throughput: the data-parallel advice this project starts from (a batch of at
least 32 per GPU, at least 2 loader workers per GPU, pinned host memory, FP16 compression with
Horovod) and the Horovod knobs. The advice gives warnings: a job that ignores it runs, slower.

Setting a knob's HOROVOD_* variable in launch.env as well is an error: two values for
one setting, and which one wins would depend on the launcher.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpc_train.launch.horovod import knob_vars
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import JobSpec

MIN_SAMPLES_PER_GPU = 32    # per GPU per optimizer step
MIN_WORKERS_PER_GPU = 2     # data loader processes decoding images for each GPU


def small_gpu_batch(spec: JobSpec) -> Iterator[Problem]:
    per_step = spec.data.batch_size * spec.parallel.accumulation
    if not spec.uses_gpu or per_step >= MIN_SAMPLES_PER_GPU:
        return
    given = str(spec.data.batch_size)
    if spec.parallel.accumulation > 1:
        given += f" x parallel.accumulation {spec.parallel.accumulation}"
    yield Problem("data.batch_size", given,
                  f"under {MIN_SAMPLES_PER_GPU} samples per GPU per step leaves the GPU mostly "
                  "idle and makes batch-norm statistics noisy",
                  "raise data.batch_size (it is per rank), or use parallel.accumulation")


def few_loader_workers(spec: JobSpec) -> Iterator[Problem]:
    # Only images read from files need workers: generated data costs next to nothing.
    if spec.uses_gpu and spec.data.kind == "hdf5" and spec.data.workers < MIN_WORKERS_PER_GPU:
        yield Problem("data.workers", f"{spec.data.workers} per rank (one rank per GPU)",
                      f"under {MIN_WORKERS_PER_GPU} loader workers per GPU, decoding and augmenting "
                      "JPEGs starves the GPU",
                      f"set data.workers: {MIN_WORKERS_PER_GPU} or more (and slurm.cpus_per_task "
                      "to match)")


def unpinned_gpu_memory(spec: JobSpec) -> Iterator[Problem]:
    if spec.uses_gpu and not spec.data.pin_memory:
        yield Problem("data.pin_memory", "false on a GPU job",
                      "copies from pageable memory to the GPU are slower and cannot overlap compute",
                      "set data.pin_memory: true")


def knobs_without_horovod(spec: JobSpec) -> Iterator[Problem]:
    if spec.parallel.backend != "horovod" and knob_vars(spec.parallel.horovod):
        yield Problem("parallel.horovod", f"{', '.join(knob_vars(spec.parallel.horovod))} with "
                      f"parallel.backend {spec.parallel.backend!r}",
                      "Horovod's knobs only tune Horovod; this job does not use it",
                      "set parallel.backend: horovod, or remove the parallel.horovod keys")


def hierarchical_on_cpu(spec: JobSpec) -> Iterator[Problem]:
    if spec.parallel.horovod.hierarchical_allreduce and not spec.uses_gpu:
        yield Problem("parallel.horovod.hierarchical_allreduce", "true on a CPU job",
                      "Horovod implements hierarchical allreduce for NCCL (GPU tensors) only; its "
                      "MPI and Gloo allreduce ignore it",
                      "remove it on CPU jobs")


def one_setting_per_knob(spec: JobSpec) -> Iterator[Problem]:
    """A knob set in parallel.horovod owns its variable: launch.env may not set it too."""
    for name in sorted(set(knob_vars(spec.parallel.horovod)) & set(spec.launch.env)):
        yield Problem(f"launch.env.{name}", repr(spec.launch.env[name]),
                      f"parallel.horovod sets {name} already",
                      f"remove launch.env.{name}, or the parallel.horovod key that sets it")


def horovod_on_one_core_untuned(spec: JobSpec) -> Iterator[Problem]:
    if (spec.parallel.backend == "horovod" and spec.slurm.cpus_per_task <= 1
            and not spec.parallel.horovod.few_core_tuning):
        yield Problem("parallel.horovod.few_core_tuning", "false with one core per rank",
                      "Horovod's background thread and MPI's polling then share the rank's core "
                      "(0.68x DDP's images/s measured on 2 such ranks, 0.96x tuned)",
                      "set parallel.horovod.few_core_tuning: true, or slurm.cpus_per_task: 2")


THROUGHPUT_ERROR_RULES = (one_setting_per_knob,)
THROUGHPUT_WARNING_RULES = (small_gpu_batch, few_loader_workers, unpinned_gpu_memory,
                            knobs_without_horovod, hierarchical_on_cpu,
                            horovod_on_one_core_untuned)
