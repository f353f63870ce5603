"""No module of ours imports a module of a layer above its own (docs/architecture.md, "Layers").

Every import counts, at module level or inside a function: a lazy import still makes the lower
layer depend on the upper one. The table is the architecture; a new package must be placed in it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

LAYERS = {  # bottom to top; a module may import its own layer and those below
    "base": ("hpc_train.errors", "hpc_train._proc", "hpc_train.rundir", "hpc_train.events",
             "hpc_train.run_state", "hpc_train.scheduler", "hpc_train.runtime", "hpc_train.argtypes",
             "hpc_train.usercode"),
    "domain": ("hpc_train.spec", "hpc_train.launch", "hpc_train.checkpoint", "hpc_train.data",
               "hpc_train.models", "hpc_train.parallel"),
    "rank": ("hpc_train.train",),
    "job": ("hpc_train.job", "hpc_train.evaluate", "hpc_train.export"),
    "login": ("hpc_train.slurm", "hpc_train.inspection", "hpc_train.doctor", "hpc_train.bench",
              "hpc_train.workflow", "hpc_train.api"),
    "entry": ("hpc_train.cli", "hpc_train.__main__"),
}
ORDER = list(LAYERS)


def layer_of(module: str) -> str | None:
    matches = [(len(prefix), name) for name, prefixes in LAYERS.items() for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, package: str) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative: resolve against this module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            # `from hpc_train import events`: the names may be modules themselves
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("hpc_train")}


def violations() -> list[str]:
    problems = []
    for path in sorted((REPO / "hpc_train").rglob("*.py")):
        name = module_name(path)
        if name == "hpc_train":
            continue
        own = layer_of(name)
        if own is None:
            problems.append(f"{name}: not placed in any layer (add it to LAYERS)")
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for target in sorted(imported(ast.parse(path.read_text()), package)):
            other = layer_of(target)
            if other is not None and ORDER.index(other) > ORDER.index(own):
                problems.append(f"{name} ({own}) imports {target} ({other})")
    return problems


def test_no_module_imports_a_layer_above_its_own():
    assert violations() == []


def test_the_layer_check_sees_a_violation():
    tree = ast.parse("def f():\n    from hpc_train.train.trainer import Trainer\n")
    targets = imported(tree, "hpc_train.runtime")
    assert "hpc_train.train.trainer" in targets
    assert ORDER.index(layer_of("hpc_train.train.trainer")) > ORDER.index(layer_of("hpc_train.runtime.stop"))

