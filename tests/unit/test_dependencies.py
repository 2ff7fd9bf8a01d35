"""What ``pip install fedapp`` brings, and what each entry point imports.

- every third-party package that fedapp/, scripts/ and benchmarks/ import is declared in
  pyproject.toml: in the base install, or in the extra whose ``with needs_extra(...)`` block
  imports it (fedapp.data.extras), or, for a script that ships to a device without fedapp, in
  the extra it belongs to (STANDALONE), so a clean install never misses one;
- the base install is what a device with its own data runs: neither it nor anything it requires
  brings Ray (Flower's simulation extra), matplotlib or pandas;
- ``fedapp --help`` and the model-space subcommands import neither Flower nor torch;
- a ClientApp whose node trains on its own .npz file works without the data extra and Ray
  (tests/support/device_probe.py), and a node asked to cut a shard without them names the install.
  With ``FEDAPP_DEVICE_VENV=<venv>`` the probe also runs in that venv, where they must be absent.
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
from packaging.markers import default_environment
from packaging.requirements import Requirement

from fedapp.data import extras

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: Folders whose imports a user's install must satisfy (tests/ needs the test extra).
SCANNED = ("fedapp", "scripts", "benchmarks")
#: The base install's stand-in in the maps below (extras have names).
BASE = ""
#: Distributions a device's base install must not bring, directly or through a requirement.
NOT_ON_A_DEVICE = ("ray", "matplotlib", "pandas", "seaborn", "scipy", "flwr-datasets", "mlxtend")
DEVICE_VENV = os.environ.get("FEDAPP_DEVICE_VENV", "")
#: Scripts that run without fedapp (so without ``needs_extra``), and the extra declaring theirs.
STANDALONE = {REPO / "scripts" / "deploy" / "serve_onnx.py": extras.EXPORT}


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement such as ``flwr[simulation]>=1.42``."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()


def _local_modules() -> set[str]:
    """Modules of this repository that scripts import by file name (benchmarks/flwr_runs.py)."""
    return {p.stem for folder in SCANNED for p in (REPO / folder).rglob("*.py")} | {
        p.stem for p in (REPO / "tests").rglob("*.py")
    }


def _extra_of(block: ast.With) -> str | None:
    """The extra a ``with needs_extra(EXTRA, ...):`` block names (a literal or a constant of
    fedapp.data.extras); None for any other ``with``."""
    for item in block.items:
        call = item.context_expr
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("needs_extra"):
            extra = call.args[0]
            return extra.value if isinstance(extra, ast.Constant) else getattr(extras, extra.id)
    return None


def _runtime_imports(node: ast.AST, extra: str = BASE) -> list[tuple[ast.AST, str]]:
    """Every import under ``node`` with the extra it belongs to, less ``if TYPE_CHECKING:``
    blocks (never run)."""
    found = [(node, extra)] if isinstance(node, ast.Import | ast.ImportFrom) else []
    if isinstance(node, ast.With):
        extra = _extra_of(node) or extra
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            found += [n for other in child.orelse for n in _runtime_imports(other, extra)]
        else:
            found += _runtime_imports(child, extra)
    return found


def imported_top_modules(folder: Path) -> dict[str, set[str]]:
    """Top-level names of every absolute import that runs in ``folder``'s Python files, at
    module level or inside functions, by the extra whose ``needs_extra`` block holds the import
    (``BASE`` outside any, or a standalone script's own extra); read from the AST, nothing is
    imported."""
    names: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node, extra in _runtime_imports(tree, STANDALONE.get(path, BASE)):
            if isinstance(node, ast.Import):
                names.setdefault(extra, set()).update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.setdefault(extra, set()).add(node.module.split(".")[0])
    return names


def third_party_imports() -> dict[str, dict[str, str]]:
    """Per extra (``BASE``: none), imported third-party module -> the distribution that
    provides it (installed here)."""
    local = _local_modules() | {"fedapp"}
    providers = importlib.metadata.packages_distributions()
    found: dict[str, dict[str, str]] = {}
    for folder in SCANNED:
        for extra, modules in imported_top_modules(REPO / folder).items():
            for module in sorted(modules - set(sys.stdlib_module_names) - local):
                assert module in providers, f"{module} is imported but no package provides it"
                found.setdefault(extra, {})[module] = _name(providers[module][0])
    return found


def _declared(extra: str) -> set[str]:
    """The distributions an install with ``extra`` asks for, the extras it names included."""
    project = PYPROJECT["project"]
    requirements = list(project["dependencies"])
    pending = [extra] if extra else []
    while pending:
        for requirement in project["optional-dependencies"][pending.pop()]:
            if _name(requirement) == "fedapp":
                pending += re.search(r"\[(.*)\]", requirement).group(1).split(",")
            else:
                requirements.append(requirement)
    return {_name(r) for r in requirements}


def test_every_imported_package_is_declared_where_its_code_belongs() -> None:
    for extra, modules in third_party_imports().items():
        assert extra in {BASE, *PYPROJECT["project"]["optional-dependencies"]}, extra
        missing = {m: d for m, d in modules.items() if d not in _declared(extra)}
        where = f"the {extra!r} extra" if extra else "the base install"
        assert not missing, f"imported by {where} but not declared there: {missing}"


def test_the_scan_sees_the_imports_inside_functions() -> None:
    # the data loaders import these where they are used; a scan of module level would miss them
    found = third_party_imports()
    assert {"datasets", "huggingface_hub", "mlxtend", "sklearn", "matplotlib", "pandas"} <= set(
        found[extras.DATA]
    )
    assert found[BASE]["PIL"] == "pillow" and found[extras.DATA]["sklearn"] == "scikit-learn"


def test_the_scan_skips_imports_for_type_checkers_only(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas\n"
        "else:\n    import json\ndef f():\n    import yaml\n"
        "    with needs_extra(DATA, 'x'):\n        import mlxtend.data\n"
        "with needs_extra('simulation', 'y'):\n    from ray import init\n"
    )
    assert imported_top_modules(tmp_path) == {
        BASE: {"typing", "json", "yaml"},
        "data": {"mlxtend"},
        "simulation": {"ray"},
    }


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution that installing ``requirements`` brings, read from the metadata of
    the versions installed here (markers evaluated for this machine, extras followed)."""
    seen: set[str] = set()
    pending = [Requirement(r) for r in requirements]
    while pending:
        requirement = pending.pop()
        name = _name(requirement.name)
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            lines = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:  # brought, but not installed here
            continue
        for line in lines:
            needed = Requirement(line)
            wanted = ["", *sorted(requirement.extras)]
            if needed.marker is None or any(
                needed.marker.evaluate(default_environment() | {"extra": e}) for e in wanted
            ):
                pending.append(needed)
    return {key.split("[")[0] for key in seen}


def test_the_base_install_brings_no_simulation_engine_and_no_plotting() -> None:
    project = PYPROJECT["project"]
    base = _closure(project["dependencies"])
    assert {"flwr", "torch", "torchvision", "numpy", "pillow", "pyyaml", "tqdm"} <= base
    assert not [name for name in NOT_ON_A_DEVICE if name in base], sorted(base)
    # the check follows requirements of requirements: scikit-learn brings scipy, flwr-datasets
    # seaborn
    assert {"matplotlib", "scipy", "seaborn"} <= _closure(project["optional-dependencies"]["data"])
    assert "ray" in _closure(project["optional-dependencies"]["simulation"])
    # the simulation extra runs the server and clients of every data set: it brings the data one
    assert _declared(extras.DATA) <= _declared("simulation")
    # .ci/run installs the test extra: it must bring the simulation engine the tests run
    assert _declared("simulation") | {"tensorboard"} <= _declared("test")


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
        "from fedapp.tools.cli import main\n"
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
    code = (
        "import fedapp.apps.client_app, fedapp.methods.fedavg.client, fedapp.methods.feast.client\n"
        "rc = 0"
    )
    loaded = _modules_after(code)["loaded"]
    assert "flwr" in loaded and "torch" in loaded
    assert "ray" not in loaded and "matplotlib" not in loaded


def _probe(python: str, work: Path, *flags: str) -> dict[str, object]:
    """tests/support/device_probe.py run by ``python`` (outside the repository: only what is
    installed)."""
    result = subprocess.run(
        [python, "-P", str(REPO / "tests" / "support" / "device_probe.py"), *flags, str(work)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _assert_device_without_data_extra(result: dict[str, object]) -> None:
    assert result["own-data-examples"] == 37 and result["own-data-error"] is None
    assert result["loaded"] == []
    # asked to cut a shard of digits, the node refuses the handshake naming the missing install
    assert "embedded data set 'digits' needs the Python package 'sklearn'" in result["shard-error"]
    assert 'pip install "fedapp[data]"' in result["shard-error"]


def test_a_node_with_its_own_data_needs_no_data_extra(tmp_path: Path) -> None:
    _assert_device_without_data_extra(_probe(sys.executable, tmp_path, "--block"))


def test_the_probe_sees_the_data_extra_where_it_is_installed(tmp_path: Path) -> None:
    result = _probe(sys.executable, tmp_path)  # the tests' install has every extra
    assert result["own-data-examples"] == 37 and result["shard-error"] is None
    assert "sklearn" in result["loaded"]  # the shard of digits was cut with scikit-learn


@pytest.mark.skipif(not DEVICE_VENV, reason="FEDAPP_DEVICE_VENV names no device venv")
def test_the_device_venv_is_a_base_install(tmp_path: Path) -> None:
    python = str(Path(DEVICE_VENV).expanduser().resolve() / "bin" / "python")
    present = subprocess.run(
        [
            python,
            "-P",
            "-c",
            f"import importlib.util as u; print([m for m in {NOT_ON_A_DEVICE!r}"
            " if u.find_spec(m.replace('-', '_')) is not None])",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert present.returncode == 0 and present.stdout.strip() == "[]", present
    _assert_device_without_data_extra(_probe(python, tmp_path))
