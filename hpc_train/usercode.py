"""User code named in a spec: the one door through which a model, a dataset or an optimizer of
the user's enters a run.

A reference is `package.module:callable` (the convention of entry points and `gunicorn
module:app`), e.g. `my_lab.models:unet` or `torch.optim:RAdam`; the callable may be an
attribute path (`my_lab.models:Zoo.unet`). Three steps, each where it belongs:

- `parse` (pure): the form, with a rule and a fix when it is wrong. The spec loader calls it.
- `locate` (login node): the module's source file, found on the file system from the submit
  directory and this Python's path. Nothing is imported, so nothing of the user's runs as a side
  effect of `validate`; the code snapshot copies the package it finds there.
- `load` (ranks): import and fetch the callable. A failure names the reference and keeps the
  user's own traceback (their file and line) as its cause.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from hpc_train.errors import HpcTrainError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_NAME}(?:\.{_NAME})*"
_FORM = re.compile(rf"^({_DOTTED}):({_DOTTED})$")
EXAMPLE = "my_lab.models:unet"


class UserCodeError(HpcTrainError):
    """A reference that cannot be used: not found, not importable, or not the right kind of
    callable. Its cause (`__cause__`) is the user's own exception, where there is one."""


@dataclass(frozen=True)
class Reference:
    module: str       # dotted module path: my_lab.models
    attribute: str    # dotted attribute path in it: unet, or Zoo.unet

    def __str__(self) -> str:
        return f"{self.module}:{self.attribute}"

    @property
    def top_package(self) -> str:
        return self.module.split(".")[0]


def looks_like_reference(text: Any) -> bool:
    """Whether a spec value is meant as a reference (it has the colon), right or wrong."""
    return isinstance(text, str) and ":" in text


def parse(text: str) -> Reference:
    """The reference `text` names; ValueError with the rule and an example when its form is wrong."""
    match = _FORM.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"a reference to your code is package.module:callable (dotted Python "
                         f"names, one colon), e.g. {EXAMPLE}")
    return Reference(match.group(1), match.group(2))


def locate(reference: Reference, roots: Iterable[Path]) -> Path | None:
    """The source file of the reference's module under the first of `roots` that holds it
    (a package's `__init__.py`, or `module.py`); None where none does. Pure file-system
    lookups: no import, so no code of the user's runs."""
    parts = reference.module.split(".")
    for root in roots:
        base = Path(root).joinpath(*parts)
        # Folders on the way may be plain (namespace packages), as Python allows.
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return candidate
    return None


def search_roots(own: Iterable[Path]) -> list[Path]:
    """Where a job's references are looked for: the user's own folders (the submit directory,
    the spec's `run.code`), then this Python's own path (installed packages)."""
    return [*own, *(Path(p) for p in sys.path if p and Path(p).is_dir())]


def package_folder(reference: Reference, source: Path) -> Path:
    """The folder of the reference's top package (or its single module file), given the
    module's source file: what the code snapshot copies."""
    depth = len(reference.module.split("."))
    if source.name == "__init__.py":
        return source.parents[depth - 1]
    return source if depth == 1 else source.parents[depth - 2]


def add_to_path(folders: Iterable[str]) -> None:
    """Make the spec's `run.code` folders importable in this process (a rank, `evaluate`,
    `export`), after what is on the path already: the run's code snapshot, which holds the
    copies taken at submit, comes first where it is there."""
    sys.path.extend(folder for folder in folders if folder not in sys.path)


def load(text: str | Reference) -> Any:
    """Import the module (on a rank) and return the named attribute."""
    reference = text if isinstance(text, Reference) else parse(text)
    try:
        target: Any = importlib.import_module(reference.module)
    except ModuleNotFoundError as exc:
        if exc.name and reference.module.startswith(exc.name):
            raise UserCodeError(f"{reference}: no module named {exc.name!r} on this node's Python "
                                f"path (sys.path[:3] = {sys.path[:3]}). Fix: submit from the folder "
                                "that holds the package, or list its folder in run.code") from exc
        raise UserCodeError(f"{reference}: importing {reference.module} failed: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module raised; their traceback is the cause
        raise UserCodeError(f"{reference}: importing {reference.module} raised "
                            f"{type(exc).__name__}: {exc}") from exc
    for name in reference.attribute.split("."):
        try:
            target = getattr(target, name)
        except AttributeError:
            public = sorted(n for n in dir(target) if not n.startswith("_"))[:20]
            raise UserCodeError(f"{reference}: {name!r} is not defined in {reference.module}; "
                                f"it defines {', '.join(public) or 'nothing public'}") from None
    if not callable(target):
        raise UserCodeError(f"{reference}: {type(target).__name__} is not callable; name a "
                            "function or a class")
    return target


def call(text: str, what: str, *args: Any, **kwargs: Any) -> Any:
    """`load(text)(*args, **kwargs)`; a TypeError raised by the call itself (wrong keywords,
    a wrong signature) names the reference, what it should build and the options passed."""
    function = load(text)
    try:
        return function(*args, **kwargs)
    except TypeError as exc:
        if exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
            raise UserCodeError(f"{text} could not be called to build {what} with "
                                f"{len(args)} positional argument(s) and options "
                                f"{sorted(kwargs)}: {exc}") from exc
        raise


def load_step(text: str, key: str) -> Any:
    """The user's step or evaluation function (`key`: task.name or task.eval), checked to take
    (model, batch) as the trainer calls it: a wrong signature is one line before any step."""
    import inspect

    function = load(text)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):      # a builtin without a signature: let the call tell
        return function
    try:
        signature.bind(None, None)
    except TypeError:
        raise UserCodeError(f"{key} {text} takes {signature}: it is called as {text.split(':')[-1]}"
                            "(model, batch), batch being (inputs, targets) on the rank's device. "
                            "Fix: give it those two parameters") from None
    return function

