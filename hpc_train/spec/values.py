"""Rules for single values that are more than a type and a range: Slurm times, memory sizes,
names that end up in paths and on command lines.

Each `check_*` returns None when the value is fine, else `(rule, fix)`; the loader adds the key
and the value. Commands are built as argument lists elsewhere, so these rules are a second line
of defence and a way to fail on the login node instead of inside a queued job.
"""

from __future__ import annotations

import ipaddress
import re

from hpc_train import usercode
from hpc_train.scheduler.parse import DURATION_FORMATS, parse_duration


def pattern_check(pattern: re.Pattern, rule: str, fix: str):
    """A `check_*` for values that `pattern` matches whole: None, else (rule, fix)."""
    def check(text: str):
        return None if pattern.fullmatch(text) else (rule, fix)

    return check


def _one_line(what: str):
    """A `check_*` refusing newlines and NUL, which would break an sbatch line or an argv word."""
    def check(text: str):
        if {"\n", "\r", "\0"} & set(text):
            return (f"{what} may not contain newlines or NUL", "put the value on one line")
        return None

    return check


# Every pattern here is applied with `fullmatch`: `re.match` with `$` also accepts a value that
# ends in a newline ("smoke\n"), which would then break an sbatch line or a path. `\d` is ASCII
# only (re.ASCII): Slurm reads no other digits.
RUN_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Partition, account, qos and constraint names. Constraints need & | ! ( ) [ ] * , : for
# expressions such as "a100&(ib|eth)"; nothing here is a quote, `$`, `;`, a space or a newline.
SLURM_NAME = re.compile(r"[A-Za-z0-9._,:|&!()\[\]*@+=-]+")
# Linux interface names: at most 15 characters, no slash or space.
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
# A dotted key, SECTION.KEY, as --set takes it.
DOTTED_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+")


def check_slurm_time(text: str):
    seconds = parse_duration(text)
    if seconds is None:
        return (f"not a Slurm time limit (formats: {DURATION_FORMATS})",
                'write the limit as a quoted string, e.g. slurm.time: "01:30:00" for 90 minutes')
    if seconds == 0:
        return ("a zero time limit means 'no limit' to Slurm, and the job needs a deadline "
                "to checkpoint before",
                'set a real limit, e.g. slurm.time: "00:30:00"')
    return None


check_run_name = pattern_check(
    RUN_NAME, "run.name becomes a directory and a Slurm job name: 1-64 characters from "
    "A-Z a-z 0-9 . _ - (no spaces, slashes or shell characters)",
    "use a plain name, e.g. run.name: resnet50-imagenet")
check_memory = pattern_check(
    re.compile(r"\d+[KMGT]?", re.ASCII), "Slurm memory is a whole number with an optional unit "
    "K, M, G or T (no space, no 'B', no decimals)",
    'write e.g. slurm.mem: "16G", or "0" for all of the node\'s memory')
check_slurm_name = pattern_check(
    SLURM_NAME, "Slurm names may only hold letters, digits and . _ , : | & ! ( ) [ ] * @ + = - "
    "(no spaces, quotes, $, ;, backticks, redirections or newlines)",
    "use the name exactly as `sinfo`/`sacctmgr` show it")
check_env_name = pattern_check(
    re.compile(r"[A-Za-z_][A-Za-z0-9_]*"), "environment variable names are letters, digits and _, "
    "not starting with a digit", "rename it, e.g. OMP_NUM_THREADS")
check_sbatch_option = pattern_check(
    re.compile(r"[a-z0-9][a-z0-9_-]*"), "sbatch option names are lower-case letters, digits, _ "
    "and -, without the leading --",
    "write the long option name, e.g. slurm.extra: {exclusive: \"\", mail-type: END}")
check_env_value = _one_line("environment values")
check_argument = _one_line("command-line arguments and sbatch options")


def check_path(text: str):
    if not text:
        return ("a path cannot be empty", "give a directory, or null where allowed")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return ("paths may not contain newlines, NUL or other control characters",
                "remove the control characters from the path")
    return None


def check_interface(text: str):
    if "/" in text:
        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            return ("a subnet is an address and a prefix length in CIDR notation",
                    "write e.g. launch.network_interface: 10.1.0.0/16")
        return None
    if INTERFACE_NAME.fullmatch(text):
        return None
    return ("an interface name has 1-15 characters from A-Z a-z 0-9 . _ : @ - (or give a subnet "
            "such as 10.1.0.0/16)",
            "use the name `ip -brief address` shows on the compute nodes, e.g. ib0")


MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
              "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")


def check_mail_type(text: str):
    unknown = [t for t in text.split(",") if t not in MAIL_TYPES]
    if not unknown:
        return None
    return (f"{', '.join(repr(t) for t in unknown)} is not a Slurm mail type ({', '.join(MAIL_TYPES)})",
            "write e.g. slurm.mail_type: END,FAIL")


check_mail_user = pattern_check(
    re.compile(r"[A-Za-z0-9._%+-]+(@[A-Za-z0-9.-]+)?"), "a mail address (or a user name) without "
    "spaces, quotes or shell characters", "write e.g. slurm.mail_user: me@example.org")


def check_increasing(values: list):
    bad = [v for v in values if v < 1]
    if bad:
        return ("milestones are epochs and must be >= 1", "e.g. optim.step_milestones: [30, 60, 80]")
    if any(b <= a for a, b in zip(values, values[1:])):
        return ("milestones must be strictly increasing", "sort them, e.g. [30, 60, 80]")
    return None


def choice_or_reference(choices: tuple[str, ...], what: str):
    """A `check_*` for a key that takes one of our `choices` or a reference to the user's own
    code (usercode.py): `model.name`, `optim.name`."""
    def check(text: str):
        if text in choices:
            return None
        if usercode.looks_like_reference(text):
            try:
                usercode.parse(text)
            except ValueError as exc:
                return (str(exc), f"write it as module:callable, e.g. {usercode.EXAMPLE}")
            return None
        import difflib

        close = difflib.get_close_matches(str(text), choices, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return (f"must be one of {', '.join(choices)}, or a reference package.module:callable "
                f"to your own {what}", f"{hint}e.g. {choices[0]}, or {usercode.EXAMPLE}")

    return check


def check_reference(text: str):
    """A key that only takes a reference to the user's code (data.dataset)."""
    try:
        usercode.parse(text)
    except ValueError as exc:
        return (str(exc), "write it as module:callable, e.g. my_lab.data:images")
    return None


check_class_name = pattern_check(re.compile(r"[A-Za-z_][A-Za-z0-9_]*"),
                                 "a class name is one Python identifier",
                                 "write the class's own name, e.g. Block (no module path)")
