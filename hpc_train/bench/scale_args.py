"""`bench scale`'s arguments: node counts and measurements (light: the parser imports it)."""

from __future__ import annotations

import argparse

# launch: mpirun and srun; stops: USR2, scontrol requeue and the driver's CPU (the mpirun run
# goes on); freeze: staging and the watchdog; doctor: `doctor --nodes`.
MEASURES = ("launch", "stops", "freeze", "doctor")


def parse_counts(text: str) -> list[int]:
    """"2,4,8" -> [2, 4, 8]; every count a whole number >= 1."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: node counts separated by commas, e.g. 2,4,8")
    return counts


def parse_measures(text: str) -> tuple[str, ...]:
    """"launch,doctor" -> ("launch", "doctor"), each one of MEASURES."""
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    if not chosen or not set(chosen) <= set(MEASURES):
        raise argparse.ArgumentTypeError(f"{text!r}: measurements from {','.join(MEASURES)}")
    return chosen
