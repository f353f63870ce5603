"""Where CI's time went: the phases .ci/run timed, then pytest's JUnit report by tier and module.

    python .ci/times.py PHASES_FILE JUNIT_XML [JUNIT_XML ...] [--top N]

PHASES_FILE has one "seconds<TAB>phase" line per phase; a name that starts with spaces is a part
of the phase before it (a lane of tests run beside another) and is not added to the total. The tier of a test is the property
tests/conftest.py records on it (fast, ranks, slurm, multinode). A test's time in the report is
its setup, call and teardown together, so a module fixture that runs the module's jobs counts
in the module's first test. Reads what it can: a missing or truncated file is said, not raised.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def read_phases(path: Path) -> list[tuple[str, float]]:
    phases = []
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        print(f"(no phase times: {error})")
        return phases
    for line in lines:
        seconds, _, name = line.partition("\t")
        try:
            phases.append((name, float(seconds)))
        except ValueError:
            print(f"(skipped a phase line: {line!r})")
    return phases


def read_cases(path: Path) -> list[dict]:
    """Each test case of the report: module, tier, seconds, outcome."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:
        print(f"(no test times: {path}: {error})")
        return []
    cases = []
    for case in root.iter("testcase"):
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        cases.append({"module": module_of(case.get("classname", "?")), "tier": properties.get("tier", "?"),
                      "seconds": float(case.get("time") or 0), "outcome": outcome})
    return cases


def module_of(classname: str) -> str:
    """tests.e2e.test_x.TestClass -> tests/e2e/test_x.py (a class name is dropped)."""
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


def table(rows: list[tuple], header: tuple) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(row: tuple) -> str:   # the first column to the left, numbers to the right
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([line(header), *map(line, rows)])


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phases", type=Path)
    parser.add_argument("junit", type=Path, nargs="+", help="pytest --junitxml reports (one per lane)")
    parser.add_argument("--top", type=int, default=25, help="modules listed (the slowest first)")
    args = parser.parse_args(argv)

    phases = read_phases(args.phases)
    if phases:
        print("== CI phases")
        total = sum(s for name, s in phases if not name.startswith(" "))
        print(table([(name, f"{s:.0f}", minutes(s)) for name, s in phases] +
                    [("total", f"{total:.0f}", minutes(total))], ("phase", "seconds", "")))
    cases = [case for report in args.junit for case in read_cases(report)]
    if not cases:
        return 0
    tiers, modules = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0, ""])
    for case in cases:
        tiers[case["tier"]][0] += case["seconds"]
        tiers[case["tier"]][1] += case["outcome"] != "skipped"
        entry = modules[case["module"]]
        entry[0] += case["seconds"]
        entry[1] += case["outcome"] != "skipped"
        entry[2] = case["tier"] if entry[2] in ("", case["tier"]) else "mixed"
    print("\n== tests by tier (seconds summed over the tests of a tier; lanes run side by side)")
    print(table([(t, n, f"{s:.0f}", minutes(s)) for t, (s, n) in sorted(tiers.items(), key=lambda kv: -kv[1][0])],
                ("tier", "tests run", "seconds", "")))
    ranked = sorted(modules.items(), key=lambda kv: -kv[1][0])
    print(f"\n== the {min(args.top, len(ranked))} slowest of {len(ranked)} modules")
    print(table([(m, tier, n, f"{s:.0f}") for m, (s, n, tier) in ranked[:args.top]],
                ("module", "tier", "tests run", "seconds")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
