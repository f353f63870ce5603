"""Which keys differ between two resolved specs (as dicts): for resume and its guard."""

from __future__ import annotations


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, sorted (pure)."""
    keys = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, f"{prefix}{name}.")
        elif a != b:
            keys.append(f"{prefix}{name}")
    return keys
