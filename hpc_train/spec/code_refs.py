"""The user's code a spec names, checked on the login node and found for the code snapshot.

`validate` and `submit` look for each reference's module (usercode.locate: file-system lookups,
no import) in the submit directory, the spec's `run.code` folders and this Python's path, and
refuse the spec in one line per reference that names nothing. The packages found in the submit
directory or `run.code` are the user's: the snapshot copies them with ours
(slurm/snapshot.py); those found elsewhere (torch.optim, an installed package) are the
environment's, like torch itself.
"""

from __future__ import annotations

from pathlib import Path

from hpc_train import usercode
from hpc_train.spec.problems import Problem, SpecInvalid
from hpc_train.spec.schema import JobSpec


def named_code(spec: JobSpec) -> list[tuple[str, str]]:
    """(key, reference) for every place the spec names the user's code."""
    named = [("model.name", spec.model.name), ("model.blocks", spec.model.blocks),
             ("optim.name", spec.optim.name),
             ("data.dataset", spec.data.dataset), ("task.name", spec.task.name),
             ("task.eval", spec.task.eval)]
    return [(key, text) for key, text in named if usercode.looks_like_reference(text)]


def own_roots(spec: JobSpec, submit_dir: Path) -> list[Path]:
    """The folders whose packages are the user's: the submit directory and run.code."""
    return [submit_dir.resolve(), *(submit_dir / folder for folder in spec.run.code)]


def code_problems(spec: JobSpec, submit_dir: Path) -> list[Problem]:
    """One problem per reference whose module is found nowhere (or a run.code folder missing)."""
    problems = [Problem("run.code", repr(folder), "not a folder visible from here",
                        "give the folder that holds your package (relative to the submit "
                        "directory), or remove it")
                for folder in spec.run.code if not (submit_dir / folder).is_dir()]
    roots = usercode.search_roots(own_roots(spec, submit_dir))
    for key, text in named_code(spec):
        reference = usercode.parse(text)
        if usercode.locate(reference, roots) is None:
            file = Path(*reference.module.split(".")).with_suffix(".py")
            problems.append(Problem(
                key, repr(text), f"no module {reference.module} in the submit directory "
                f"{submit_dir}, run.code or this Python's path",
                f"submit from the folder that holds {file} (or its package), add that folder to "
                "run.code, or install the package"))
    return problems


def check_code(spec: JobSpec, submit_dir: Path | None = None) -> None:
    """Raise SpecInvalid (exit 2) when a reference names no module that can be found."""
    problems = code_problems(spec, Path(submit_dir or Path.cwd()))
    if problems:
        raise SpecInvalid(problems)


def own_packages(spec: JobSpec, submit_dir: Path) -> dict[str, Path]:
    """Top package name -> its folder (or module file), for each reference whose module lies in
    the submit directory or run.code: what the code snapshot copies."""
    roots = own_roots(spec, submit_dir)
    found: dict[str, Path] = {}
    for _key, text in named_code(spec):
        reference = usercode.parse(text)
        source = usercode.locate(reference, roots)
        if source is not None:
            found[reference.top_package] = usercode.package_folder(reference, source)
    return found
