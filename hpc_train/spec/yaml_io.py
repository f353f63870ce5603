"""Reading spec YAML safely and a little more strictly than PyYAML does by default.

`SpecLoader` is `yaml.SafeLoader` (plain data only: `!!python/...` tags are an error, never run)
with two YAML 1.1 surprises removed, because both silently change a job:
  - base-60 numbers: unquoted `time: 1:30:00` would be the int 5400 (5400 minutes);
  - old octal: `010` would be 8.
Both now stay strings, which the field converters then read as the user meant. Duplicate keys,
which PyYAML resolves by keeping the last one, are an error. So are aliases that expand past
MAX_VALUES values (the "billion laughs" shape: nine aliases of nine aliases ... of a list), and
aliases that refer to themselves: PyYAML builds such a value cheaply by sharing, but everything
that walks it (an error message, the run's copy of the spec) pays for every expanded value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hpc_train.spec.problems import Problem

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# PyYAML's own patterns without the base-60 (and, for ints, the 0-prefixed octal) forms.
_INT = re.compile(r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""", re.X)
# Exponents as YAML 1.2 writes them too (1e-6, 3E5: strings to PyYAML), so that they are
# numbers where the schema does not say (a user model's or optimizer's options).
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                    |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X)


MAX_VALUES = 10_000  # values after aliases are expanded; a real spec has a few hundred
MAX_DEPTH = 64       # values inside values; a real spec nests 3 or 4 deep
MAX_BYTES = 1 << 20  # a spec file; a real one is a few KB (a 50 MB one took 12 s to refuse)


class AliasBomb(yaml.composer.ComposerError):
    """Aliases that expand past MAX_VALUES values, or refer to themselves."""


class TooDeep(yaml.composer.ComposerError):
    """Values nested past MAX_DEPTH (PyYAML composes recursively: deeper, and Python's
    recursion limit would end it with a traceback)."""


class NumberTooLong(yaml.constructor.ConstructorError):
    """An integer Python will not read (more than 4,300 digits): no spec value is one."""


def expanded_size(node: yaml.Node, limit: int = MAX_VALUES) -> int:
    """How many values `node` stands for with every alias expanded, counted once per node
    (aliases share nodes), so the count costs the document's size, not the expansion's; raises
    AliasBomb past `limit` or on a node inside itself."""
    sizes: dict[int, int | None] = {}     # id(node) -> its size; None while it is being counted

    def size(item: yaml.Node) -> int:
        key = id(item)
        if key in sizes:
            if sizes[key] is None:
                raise AliasBomb(None, None, "an alias refers to the value that contains it",
                                item.start_mark)
            return sizes[key]
        sizes[key] = None
        children = item.value if isinstance(item, yaml.SequenceNode) else (
            [part for pair in item.value for part in pair] if isinstance(item, yaml.MappingNode) else [])
        total = 1 + sum(size(child) for child in children)
        if total > limit:
            raise AliasBomb(None, None, f"aliases expand to more than {limit:,} values",
                            item.start_mark)
        sizes[key] = total
        return total

    return size(node)


class SpecLoader(yaml.SafeLoader):
    """SafeLoader without base-60 numbers or old octal, rejecting duplicate keys and alias
    bombs."""

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:     # Python refuses to read ints of more than 4,300 digits
            raise NumberTooLong(None, None, f"a number of {len(node.value):,} digits",
                                node.start_mark) from None

    _depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_DEPTH:
            raise TooDeep(None, None, f"values nested more than {MAX_DEPTH} deep",
                          self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"duplicate key {key!r} (first at line {seen[key].line + 1})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


SpecLoader.add_constructor(_INT_TAG, SpecLoader.construct_yaml_int)
SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
SpecLoader.add_implicit_resolver(_INT_TAG, _INT, list("-+0123456789"))
SpecLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """Plain data from YAML text; raises yaml.YAMLError."""
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - SpecLoader is a SafeLoader


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """A YAML error on one line, with the line and column where the parser stopped."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    text = f"{where}{context + ': ' if context else ''}{problem}"
    return " ".join(text.split())


def read_spec_file(path: str | Path) -> tuple[dict | None, list[Problem]]:
    """The top-level mapping of a spec file, or None and the problem with the file itself."""
    name = str(path)
    source = Path(path)
    if not source.exists():
        return None, [Problem(name, None, "file not found",
                              "check the path; specs live in jobs/, e.g. jobs/smoke.yaml")]
    if not source.is_file():
        return None, [Problem(name, None, "not a file", "give the path of a .yaml spec file")]
    try:
        size = source.stat().st_size
        if size > MAX_BYTES:
            return None, [Problem(name, f"{size:,} bytes", f"a spec file is at most {MAX_BYTES:,} "
                                  "bytes (a real one is a few KB)", "give the spec file itself, "
                                  "not data or a log")]
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem(name, None, f"cannot read the file ({exc})",
                              "check permissions and that it is UTF-8 text")]
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        return None, [_yaml_problem(name, exc)]
    if data is None:
        return None, [Problem(name, None, "the file is empty (or only comments)",
                              "start from jobs/smoke.yaml; at least run: {name: my-run}")]
    if not isinstance(data, dict):
        return None, [Problem(name, f"a {type(data).__name__}", "the top level must be a "
                              "mapping of sections (run, slurm, data, ...)",
                              "write 'section:' lines at the top level, as in jobs/smoke.yaml")]
    return data, []


def _yaml_problem(name: str, exc: yaml.YAMLError) -> Problem:
    detail = yaml_error_line(exc)
    if "python/" in detail or "constructor for the tag" in detail:
        return Problem(name, None, f"YAML tags are not allowed in a spec ({detail})",
                       "remove the tag: specs hold plain data only, and tags are never executed")
    if isinstance(exc, AliasBomb):
        return Problem(name, None, f"YAML aliases: {detail}", f"write the values out, or use "
                       f"fewer and smaller aliases (a spec holds at most {MAX_VALUES:,} values)")
    if isinstance(exc, TooDeep):
        return Problem(name, None, f"{detail}: no spec nests that deep",
                       "check the brackets and the indentation there")
    if isinstance(exc, NumberTooLong):
        return Problem(name, None, f"{detail}: more than any spec value can be",
                       "write the number you mean (counts, sizes and seeds have a few digits)")
    if "duplicate key" in detail:
        return Problem(name, None, f"a key is written twice ({detail}); YAML would silently keep "
                       "the last one", "keep one of the two entries")
    return Problem(name, None, f"not valid YAML ({detail})",
                   "fix the YAML syntax there (indent with spaces, not tabs; close brackets "
                   "and quotes)")


def dump_yaml(data: dict) -> str:
    """Block-style YAML in the given key order; loads back with SpecLoader to equal data."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
