"""What ``pip install fedapp`` brings, and what each entry point imports.

- every third-party package that fedapp/, scripts/ and benchmarks/ import is declared in
  pyproject.toml (the base install or an extra), so a clean install never misses one;
- the base install is what a device runs: Ray (Flower's simulation extra) is not in it;
- ``fedapp --help`` and the model-space subcommands import neither Flower nor torch, and a
  ClientApp imports no Ray and no matplotlib.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: Folders whose imports a user's install must satisfy (tests/ needs the test extra).
SCANNED = ("fedapp", "scripts", "benchmarks")


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement such as ``flwr[simulation]>=1.42``."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()


def _local_modules() -> set[str]:
    """Modules of this repository that scripts import by file name (benchmarks/flwr_runs.py)."""
    return {p.stem for folder in SCANNED for p in (REPO / folder).rglob("*.py")} | {
        p.stem for p in (REPO / "tests").glob("*.py")
    }


def _runtime_nodes(node: ast.AST) -> list[ast.AST]:
    """``node`` and everything under it, less ``if TYPE_CHECKING:`` blocks (never run)."""
    nodes = [node]
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            nodes += [n for other in child.orelse for n in _runtime_nodes(other)]
        else:
            nodes += _runtime_nodes(child)
    return nodes


def imported_top_modules(folder: Path) -> set[str]:
    """Top-level names of every absolute import that runs in ``folder``'s Python files, at
    module level or inside functions (read from the AST, nothing is imported)."""
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def third_party_imports() -> dict[str, str]:
    """Imported third-party module -> the distribution that provides it (installed here)."""
    local = _local_modules() | {"fedapp"}
    providers = importlib.metadata.packages_distributions()
    modules = set().union(*(imported_top_modules(REPO / folder) for folder in SCANNED))
    found = {}
    for module in sorted(modules - set(sys.stdlib_module_names) - local):
        assert module in providers, f"{module} is imported but no installed package provides it"
        found[module] = _name(providers[module][0])
    return found


def test_every_imported_package_is_declared() -> None:
    project = PYPROJECT["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for requirements in project["optional-dependencies"].values():
        declared |= {_name(r) for r in requirements}
    missing = {m: d for m, d in third_party_imports().items() if d not in declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_scan_sees_the_imports_inside_functions() -> None:
    # the data loaders import these where they are used; a scan of module level would miss them
    found = third_party_imports()
    assert {"datasets", "huggingface_hub", "PIL", "mlxtend", "sklearn", "matplotlib"} <= set(found)
    assert found["PIL"] == "pillow" and found["sklearn"] == "scikit-learn"


def test_the_scan_skips_imports_for_type_checkers_only(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas\n"
        "else:\n    import json\ndef f():\n    import yaml\n"
    )
    assert imported_top_modules(tmp_path) == {"typing", "json", "yaml"}


def test_the_base_install_has_no_simulation_engine() -> None:
    project = PYPROJECT["project"]
    assert "flwr" in {_name(r) for r in project["dependencies"]}
    assert not [r for r in project["dependencies"] if "simulation" in r or _name(r) == "ray"]
    assert any("simulation" in r for r in project["optional-dependencies"]["simulation"])
    # .ci/run installs the test extra: it must bring the simulation engine the tests run
    own = [r for r in project["optional-dependencies"]["test"] if _name(r) == "fedapp"]
    assert own and "simulation" in re.search(r"\[(.*)\]", own[0]).group(1).split(",")


def test_upper_bounds_are_minor_versions() -> None:
    pinned = {_name(r): r for r in PYPROJECT["project"]["dependencies"]}
    assert pinned["torch"].endswith("<2.15") and pinned["torchvision"].endswith("<0.30")
    assert not [r for r in pinned.values() if "<=" in r], "cap at the next minor, not a patch"


def _modules_after(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; which heavy modules it imported, and its result."""
    probe = (
        "import sys, json\n"
        f"{code}\n"
        "heavy = ('flwr', 'ray', 'torch', 'torchvision', 'matplotlib', 'datasets', "
        "'flwr_datasets')\n"
        "print(json.dumps({'loaded': [m for m in heavy if m in sys.modules], 'rc': rc}))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _cli(argv: list[str]) -> str:
    return (
        "from fedapp.cli import main\n"
        "try:\n"
        f"    rc = main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    rc = exit.code"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["cache", "--help"],
        ["compare", "--help"],  # parses compare's arguments: imports Flower (and torch)
        ["cache", "show", "feast-small"],
        ["supernet", "--supernet", "feast-small", "--json"],
        ["macs", "--arch", "d=0,0,0,0 e=0.1,0.1,0.1,0.1 w=0,0,0,0,0"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_cli_imports_only_what_its_subcommand_needs(argv: list[str]) -> None:
    result = _modules_after(_cli(argv))
    assert result["rc"] == 0
    if argv[0] == "compare":
        assert "flwr" in result["loaded"]  # the check below would see a Flower import
    else:
        assert result["loaded"] == []


def test_a_clientapp_imports_no_ray_and_no_matplotlib() -> None:
    code = "import fedapp.client_app, fedapp.clients.fedavg, fedapp.clients.feast\nrc = 0"
    loaded = _modules_after(code)["loaded"]
    assert "flwr" in loaded and "torch" in loaded
    assert "ray" not in loaded and "matplotlib" not in loaded
