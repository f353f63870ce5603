"""Benchmarks: each reports ratios measured in one run (ours vs. a baseline)."""
