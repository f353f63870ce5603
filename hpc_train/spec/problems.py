"""One problem in a job spec: the key, the value given, the rule it breaks and the fix.

Every check in the spec package reports `Problem`s instead of raising, so one run of the
validator shows the user everything that is wrong with a file, one line per problem.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_train.errors import SpecError

_SHOW_LIMIT = 80  # long values are cut so each problem stays on one readable line


def show(value: object) -> str:
    """The value as the user should recognise it, on one line (repr escapes newlines), cut to
    _SHOW_LIMIT characters. Built piece by piece and stopped at the limit, so a huge value (a
    list of a million items, a 10,000-digit number) costs no more than a small one."""
    text, pieces = "", _repr_pieces(value, depth=0)
    for piece in pieces:
        text += piece
        if len(text) > _SHOW_LIMIT:
            return text[:_SHOW_LIMIT - 3] + "..."
    return text


def _repr_pieces(value: object, depth: int):
    """repr(value) in pieces, lazily: containers item by item, scalars cut near the limit."""
    if depth > _SHOW_LIMIT // 2:          # more brackets than the line can show
        yield "..."
    elif type(value) in (list, tuple, dict):     # exactly: a namedtuple shows itself
        items = value.items() if isinstance(value, dict) else value
        opening, closing = "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
        yield opening
        for index, item in enumerate(items):
            if index:
                yield ", "
            if isinstance(value, dict):
                yield from _repr_pieces(item[0], depth + 1)
                yield ": "
                item = item[1]
            yield from _repr_pieces(item, depth + 1)
        yield ("," if isinstance(value, tuple) and len(value) == 1 else "") + closing
    elif isinstance(value, str):
        yield repr(value[:_SHOW_LIMIT + 1])[:-1] if len(value) > _SHOW_LIMIT else repr(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * _SHOW_LIMIT:
        yield f"<an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits>"
    else:
        yield repr(value)


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
