"""pyproject.toml's import-linter contracts (the layers, top to bottom, and no cycles
inside a package) hold on the tree, the layers name every package, and a wrong-way import
or a cycle fails them: shown on a copy of the packages with one added (the tree itself is
not touched)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency reads TOML
    import tomli as tomllib

pytest.importorskip("importlinter", reason="import-linter (the dev extra) is not installed")

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
LAYERS, CYCLES = (next(c for c in CONFIG["contracts"] if c["type"] == kind)
                  for kind in ("layers", "acyclic_siblings"))
ROOTS = CONFIG["root_packages"]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the packages under `cwd`, with `cwd`'s pyproject.toml."""
    script = Path(sys.executable).with_name("lint-imports")
    command = [str(script)] if script.exists() else [shutil.which("lint-imports") or "lint-imports"]
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([*command, "--no-cache", "--no-logo", str(cwd / "pyproject.toml")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_its_layers() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS['name']} KEPT" in result.stdout
    assert f"{CYCLES['name']} KEPT" in result.stdout


def test_every_package_has_a_layer() -> None:
    """A package no layer names would be free to import anything: each of planner's
    subpackages and top-level modules, and each other root package, is in a layer."""
    named = {part.strip() for layer in LAYERS["layers"] for part in layer.split("|")}
    packages = {root for root in ROOTS if root != "planner"}
    for path in (REPO / "planner").iterdir():
        if (path / "__init__.py").exists():
            packages.add(f"planner.{path.name}")
        elif path.suffix == ".py" and path.name != "__init__.py":
            packages.add(f"planner.{path.stem}")
    assert named == packages


def _copy(tmp_path: Path) -> Path:
    """The four packages' Python files and pyproject.toml, copied under `tmp_path`."""
    for root in ROOTS:
        for source in (REPO / root).rglob("*.py"):
            target = tmp_path / source.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    shutil.copyfile(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize("contract, module, added, chain", [
    # The bottom reaching up: the Plan's vocabulary importing a cost model.
    (LAYERS, "planner/vocabulary/mesh_axes.py", "from cost_models.comm import collective_time\n",
     "planner.vocabulary.mesh_axes -> cost_models.comm"),
    # The runtime reaching up into planning, from inside a function.
    (LAYERS, "runtime/mesh.py", "\n\ndef _replanned():\n    from planner.api import plan_graph"
     "\n\n    return plan_graph\n", "runtime.mesh -> planner.api"),
    # The root package is in no layer, but its lazy imports are: reaching up through it.
    (LAYERS, "planner/models/flags.py", "from planner import GraphKnobs\n",
     "planner.models.flags -> planner (l."),
    # Two modules of one package importing each other (plan.py imports parallel_dims).
    (CYCLES, "planner/vocabulary/parallel_dims.py", "from planner.vocabulary.plan import Plan\n",
     "- .parallel_dims -> .plan"),
], ids=["vocabulary-imports-cost_models", "runtime-imports-api", "through-the-root",
        "cycle-in-vocabulary"])
def test_a_wrong_way_import_breaks_a_contract(tmp_path: Path, contract: dict, module: str,
                                              added: str, chain: str) -> None:
    copy = _copy(tmp_path)
    with open(copy / module, "a") as out:
        out.write(added)
    result = lint_imports(copy)
    assert result.returncode != 0
    assert f"{contract['name']} BROKEN" in result.stdout
    others = [c["name"] for c in CONFIG["contracts"] if c is not contract]
    assert all(f"{name} KEPT" in result.stdout for name in others)
    assert chain in result.stdout
