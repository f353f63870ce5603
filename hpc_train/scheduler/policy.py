"""What the site's Slurm does to a preempted job, read from `scontrol show config` and `scontrol
show partition`: a typed value, parsed by pure functions (the commands are run by scheduler's
`preemption`), worded for `doctor` and `validate`.

At a preemption's start Slurm signals the job's steps (SIGTERM); after the partition's GraceTime
it signals the batch step, then SIGKILLs everything KillWait seconds later. A stop save must fit
in the grace to be kept (hpc_train hears the grace's start: job/sentinel.py), in KillWait where
nothing hears it before the grace's end.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_train.scheduler.parse import parse_duration, show_fields


@dataclass(frozen=True)
class Preemption:
    partition: str
    preempt_type: str            # preempt/none, preempt/partition_prio, preempt/qos
    mode: str                    # the partition's PreemptMode, else the cluster's: OFF, REQUEUE, CANCEL, ...
    grace: float | None          # GraceTime, seconds
    kill_wait: float | None      # KillWait, seconds
    tier: int | None = None      # PriorityTier
    default: bool = False        # the partition a job without --partition gets

    @property
    def configured(self) -> bool:
        return self.preempt_type not in ("", "preempt/none") and self.mode.upper() != "OFF"


def _config(text: str) -> dict[str, str]:
    """`scontrol show config`: `Key = value` lines."""
    return {key.strip(): value.strip() for key, sep, value in
            (line.partition(" = ") for line in text.splitlines()) if sep}


def _seconds(text: str | None) -> float | None:
    """'5 sec', '30', '00:00:30' -> seconds (GraceTime and KillWait print either way)."""
    if not text:
        return None
    words = text.split()
    if words[0].isdigit():
        return float(words[0])
    return parse_duration(words[0])


def parse_preemption(config: str, partition_lines: str) -> list[Preemption]:
    """One Preemption per partition of `scontrol show partition -o`, with the cluster's
    PreemptType, PreemptMode and KillWait from `scontrol show config`."""
    cluster = _config(config)
    found = []
    for line in partition_lines.splitlines():
        part = show_fields(line)
        if "PartitionName" not in part:
            continue
        tier = part.get("PriorityTier", "")
        found.append(Preemption(
            part["PartitionName"], cluster.get("PreemptType", ""),
            part.get("PreemptMode") or cluster.get("PreemptMode", "OFF"),
            _seconds(part.get("GraceTime")), _seconds(cluster.get("KillWait")),
            int(tier) if tier.isdigit() else None, part.get("Default") == "YES"))
    return found


def for_partition(policies: list[Preemption], partition: str | None) -> Preemption | None:
    """The policy of `partition` (None: the default partition's)."""
    return next((p for p in policies if (p.partition == partition if partition else p.default)), None)


def preemption_words(policy: Preemption, save_seconds: float | None = None) -> str:
    """One line: what a preemption does to a job of this partition, and whether its saves fit."""
    kill = "?" if policy.kill_wait is None else f"{policy.kill_wait:g} s"
    if not policy.configured:
        return f"partition {policy.partition}: no preemption (PreemptMode {policy.mode}); KillWait {kill}"
    grace = "?" if policy.grace is None else f"{policy.grace:g} s"
    words = (f"partition {policy.partition}: PreemptMode {policy.mode} ({policy.preempt_type}), "
             f"GraceTime {grace}, KillWait {kill}")
    if save_seconds is not None:
        # Without a grace the batch step is signalled at once: the save has KillWait.
        room, named = (policy.grace, "the grace") if policy.grace else (policy.kill_wait, "KillWait")
        words += f"; the run's longest save took {save_seconds:.1f} s"
        if room is not None:
            words += (f", within {named}" if save_seconds < room else
                      f", longer than {named}: a preempted run loses the work since its last "
                      "periodic checkpoint")
    return words
