"""Where CI's time went: the phases .ci/run timed, then pytest's JUnit report by tier and module.

    python .ci/times.py PHASES_FILE JUNIT_XML [JUNIT_XML ...] [--top N] [--cpu FILE] [--daemons FILE]

PHASES_FILE has one "seconds<TAB>phase" line per phase; a name that starts with spaces is a part
of the phase before it (a lane of tests run beside another) and is not added to the total. The tier of a test is the property
tests/conftest.py records on it (fast, ranks, slurm, multinode). A test's time in the report is
its setup, call and teardown together, so a module fixture that runs the module's jobs counts
in the module's first test. --cpu: "SECONDS <the cpu line of /proc/stat>" lines sampled while the
tests ran, printed as the share of the cores busy, whole and per 5 minutes; --daemons: "NAME
CPU_SECONDS" lines, summed by name. Reads what it can: a missing or truncated file is said, not
raised.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def read_lines(path: Path, what: str) -> list[str]:
    """The file's lines; none, said on stdout, when it cannot be read."""
    try:
        return path.read_text().splitlines()
    except OSError as error:
        print(f"(no {what}: {error})")
        return []


def parse_each(lines: list[str], parse, what: str) -> list:
    """parse(line) for each line; a line it cannot parse is said and skipped."""
    parsed = []
    for line in lines:
        try:
            parsed.append(parse(line))
        except (ValueError, IndexError):
            print(f"(skipped a {what}: {line!r})")
    return parsed


def read_phases(path: Path) -> list[tuple[str, float]]:
    def phase(line: str) -> tuple[str, float]:
        seconds, _, name = line.partition("\t")
        return name, float(seconds)
    return parse_each(read_lines(path, "phase times"), phase, "phase line")


def read_cases(path: Path) -> list[dict]:
    """Each test case of the report: module, tier, seconds, CPU seconds (0 where the report has
    none), outcome."""
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
                      "seconds": float(case.get("time") or 0),
                      "cpu": float(properties.get("cpu_seconds") or 0), "outcome": outcome})
    return cases


def read_cpu(path: Path) -> list[tuple[float, float, float]]:
    """(seconds, busy jiffies, all jiffies) per sample of /proc/stat's cpu line, summed over cores."""
    def sample(line: str) -> tuple[float, float, float]:
        words = line.split()
        ticks = [int(w) for w in words[2:10]]
        idle = ticks[3] + ticks[4]                 # idle and iowait
        return float(words[0]), float(sum(ticks) - idle), float(sum(ticks))
    return parse_each(read_lines(path, "CPU samples"), sample, "CPU sample")


def cpu_report(samples: list[tuple[float, float, float]], cores: int, window: float = 300) -> str:
    """The share of the cores busy between the first and last sample, then per `window` s."""
    def share(a, b) -> str:
        return f"{100 * (b[1] - a[1]) / max(b[2] - a[2], 1):.0f}%"
    first, last = samples[0], samples[-1]
    used = (last[1] - first[1]) / max(last[2] - first[2], 1) * (last[0] - first[0]) * cores
    lines = [f"busy {share(first, last)} of {cores} cores over {minutes(last[0] - first[0])} "
             f"({used:.0f} core-seconds used)"]
    start = first
    for sample in samples[1:]:
        if sample[0] - start[0] >= window or sample is last:
            lines.append(f"  minute {(start[0] - first[0]) / 60:5.1f}-{(sample[0] - first[0]) / 60:5.1f}: "
                         f"{share(start, sample)}")
            start = sample
    return "\n".join(lines)


def read_daemons(path: Path) -> dict[str, float]:
    def daemon(line: str) -> tuple[str, float]:
        name, _, seconds = line.rpartition(" ")
        return name.strip("()"), float(seconds)
    used: dict[str, float] = defaultdict(float)
    for name, seconds in parse_each(read_lines(path, "daemon CPU"), daemon, "daemon line"):
        used[name] += seconds
    return used


# sacct's TotalCPU: [D-][HH:]MM:SS[.mmm]
def cpu_time(text: str) -> float:
    days, _, clock = text.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + 86400 * int(days or 0)


# A job's sbatch line names its run directory, under the directory pytest gave its test (or its
# module's fixture): /tmp/pytest-of-USER/pytest-N/[popen-gwK/]NAME/..., or in CI under its
# lane's --basetemp, /tmp/hpc_train-ci-LANE/[popen-gwK/]NAME/...
TEST_DIR = re.compile(r"(?:/pytest-of-[^/]+/pytest-\d+|/hpc_train-ci-[a-z]+)/(?:popen-gw\d+/)?([^/\s]+)")


def read_jobs(path: Path) -> dict[str, float]:
    """CPU seconds of the Slurm jobs (sacct JobIDRaw|TotalCPU|SubmitLine), summed by the test
    directory their sbatch line names ("(other)" where it names none). A step's line (an id with
    a dot) is skipped: its job's line sums its steps."""
    def job(line: str) -> tuple[str, float]:
        job_id, cpu, submit_line = line.split("|", 2)
        if "." in job_id:
            return "", 0.0
        found = TEST_DIR.search(submit_line)
        return (found.group(1) if found else "(other)"), cpu_time(cpu)
    used: dict[str, float] = defaultdict(float)
    for name, seconds in parse_each(read_lines(path, "Slurm jobs' CPU"), job, "sacct line"):
        if name:
            used[name] += seconds
    return used


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
    parser.add_argument("--cpu", type=Path, help="/proc/stat samples taken while the tests ran")
    parser.add_argument("--daemons", type=Path, help="the clusters' daemons' CPU seconds")
    parser.add_argument("--jobs", type=Path, help="sacct lines of the Slurm jobs: JobIDRaw|TotalCPU|SubmitLine")
    args = parser.parse_args(argv)

    phases = read_phases(args.phases)
    if phases:
        print("== CI phases")
        total = sum(s for name, s in phases if not name.startswith(" "))
        print(table([(name, f"{s:.0f}", minutes(s)) for name, s in phases] +
                    [("total", f"{total:.0f}", minutes(total))], ("phase", "seconds", "")))
    if args.cpu and len(samples := read_cpu(args.cpu)) >= 2:
        print("\n== the machine's CPU while the tests ran (/proc/stat)")
        print(cpu_report(samples, os.cpu_count() or 1))
    if args.daemons and (daemons := read_daemons(args.daemons)):
        print("\n== the clusters' daemons' own CPU (not their jobs'), summed by name")
        print(table([(n, f"{s:.0f}") for n, s in sorted(daemons.items(), key=lambda kv: -kv[1])],
                    ("daemon", "seconds")))
    if args.jobs and (jobs := read_jobs(args.jobs)):
        ranked = sorted(jobs.items(), key=lambda kv: -kv[1])
        print(f"\n== the Slurm jobs' CPU: {sum(jobs.values()):.0f} core-seconds; by test directory, "
              f"the {min(args.top, len(ranked))} largest of {len(ranked)}")
        print(table([(name, f"{s:.0f}") for name, s in ranked[:args.top]], ("test directory", "cpu")))
    cases = [case for report in args.junit for case in read_cases(report)]
    if not cases:
        return 0
    tiers, modules = defaultdict(lambda: [0.0, 0, 0.0]), defaultdict(lambda: [0.0, 0, "", 0.0])
    for case in cases:
        tiers[case["tier"]][0] += case["seconds"]
        tiers[case["tier"]][1] += case["outcome"] != "skipped"
        tiers[case["tier"]][2] += case["cpu"]
        entry = modules[case["module"]]
        entry[0] += case["seconds"]
        entry[1] += case["outcome"] != "skipped"
        entry[2] = case["tier"] if entry[2] in ("", case["tier"]) else "mixed"
        entry[3] += case["cpu"]
    print("\n== tests by tier (seconds summed over the tests of a tier; lanes run side by side;")
    print("   cpu: core-seconds of pytest and the processes it waited for, not Slurm jobs' ranks)")
    print(table([(t, n, f"{s:.0f}", minutes(s), f"{c:.0f}")
                 for t, (s, n, c) in sorted(tiers.items(), key=lambda kv: -kv[1][0])],
                ("tier", "tests run", "seconds", "", "cpu")))
    for key, what in ((0, "slowest"), (3, "most CPU")):
        ranked = sorted(modules.items(), key=lambda kv: -kv[1][key])
        print(f"\n== the {min(args.top, len(ranked))} {what} of {len(ranked)} modules")
        print(table([(m, tier, n, f"{s:.0f}", f"{c:.0f}") for m, (s, n, tier, c) in ranked[:args.top]],
                    ("module", "tier", "tests run", "seconds", "cpu")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
