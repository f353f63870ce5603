"""One problem in a job spec: the key, the value given, the rule it breaks and the fix.

Every check in the spec package reports `Problem`s instead of raising, so one run of the
validator shows the user everything that is wrong with a file, one line per problem.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_train.errors import SpecError

_SHOW_LIMIT = 80  # long values are cut so each problem stays on one readable line


def show(value: object) -> str:
    """The value as the user should recognise it, on one line (repr escapes newlines)."""
    text = repr(value)
    if len(text) > _SHOW_LIMIT:
        text = text[:_SHOW_LIMIT - 3] + "..."
    return text


def dotted(prefix: str, name: object) -> str:
    """`prefix` + name for a message; odd names (newlines, non-strings) shown as repr."""
    if isinstance(name, str) and name.isprintable() and name.strip() == name and name:
        return prefix + name
    return prefix + show(name)


@dataclass(frozen=True)
class Problem:
    """`key` is a dotted key ("optim.base_lr"), several joined by " + ", or a file name.

    `given` is the value(s) as shown to the user, or None when there is no single value
    (a missing key, an unknown key, a file that does not parse).
    """

    key: str
    given: str | None
    rule: str
    fix: str
    severity: str = "error"  # "error" stops the job; "warning" is printed and the job goes on

    def __str__(self) -> str:
        rule = self.rule.rstrip(".")
        if self.given is None:
            head = f"{self.key}: {rule}"
        elif self.severity == "error":
            head = f"{self.key}: {self.given} is not allowed: {rule}"
        else:
            head = f"{self.key}: {self.given}: {rule}"
        label = "Fix" if self.severity == "error" else "Consider"
        return f"{head}. {label}: {self.fix}"


def value_problem(key: str, value: object, rule: str, fix: str) -> Problem:
    return Problem(key=key, given=show(value), rule=rule, fix=fix)


class SpecInvalid(SpecError):
    """A SpecError that keeps the individual problems for callers that want them (tests, UIs).

    The message is the problems' lines joined by newlines, which is what the CLI prints.
    """

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
