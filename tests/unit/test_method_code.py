"""Source checks over the two halves of every method, for mistakes no run shows: a message or metric
name spelled out where fedapp.wire.messages or a method's keys.py names it (the halves agree by
construction only while both read the one constant), and a method that adds the run's accounting
itself."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import fedapp

PACKAGE = Path(fedapp.__file__).parent
#: Where message and metric names are written or read: the method halves and the two apps.
NAME_USERS = ("methods", "apps")
#: Where names are defined: the shared wire format and each method's own keys.
KEY_MODULES = (
    "wire/messages.py",
    *(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.glob("methods/*/keys.py")),
)
#: Literals that equal a message name but name something else: (module, literal) -> what it is.
OTHER_MEANINGS = {
    ("methods/scalefl/server.py", "level"): "summary.json's table of levels, numbered from 1",
    ("methods/scalefl/server.py", "width"): "summary.json's table of levels: a level's width",
    ("methods/fedkd_nas/nas.py", "accuracy"): "a column of the NAS history the node keeps",
}


def _key_module(relative: str) -> ModuleType:
    return importlib.import_module("fedapp." + relative.removesuffix(".py").replace("/", "."))


def _message_names() -> dict[str, str]:
    """Value -> constant of every string constant of fedapp.wire.messages and the methods' keys."""
    return {
        value: f"{relative}:{name}"
        for relative in KEY_MODULES
        for name, value in vars(_key_module(relative)).items()
        if name.isupper() and isinstance(value, str)
    }


def test_the_checked_names_include_the_method_folders_keys() -> None:
    names = _message_names()
    assert names["affordable"] == "methods/feast/keys.py:AFFORDABLE"
    assert names["nas-multiplier"] == "methods/fedkd_nas/keys.py:NAS_MULTIPLIER"
    assert names["num-examples"] == "wire/messages.py:NUM_EXAMPLES"


def _modules(*places: str) -> Iterator[tuple[str, ast.Module]]:
    for place in places:
        path = PACKAGE / place
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            yield file.relative_to(PACKAGE).as_posix(), ast.parse(file.read_text())


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes (prose may mention a name)."""
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def test_no_method_half_spells_out_a_name_that_fedapp_messages_defines() -> None:
    names = _message_names()
    bare = []
    for module, tree in _modules(*NAME_USERS):
        if module in KEY_MODULES:
            continue
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in names
                and id(node) not in docstrings
                and (module, node.value) not in OTHER_MEANINGS
            ):
                bare.append(f"{module}:{node.lineno}: {node.value!r} = {names[node.value]}")
    assert not bare, "\n".join(bare)


def test_every_exception_still_names_a_literal_that_is_there() -> None:
    """An exception whose literal is gone would let a bare copy creep back unnoticed."""
    present = {
        (module, node.value)
        for module, tree in _modules(*NAME_USERS)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert set(OTHER_MEANINGS) <= present


def _accounts_summaries(tree: ast.Module) -> list[int]:
    """Lines that call ``<something>.accounting.summary(...)``."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "summary"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "accounting"
    ]


def test_the_run_adds_the_accounting_once_and_no_method_adds_it_itself() -> None:
    """summary.json's accounting (and communication.csv) comes from the round engine's final
    test, once per run: a method that added it too would write the file twice."""
    engine = "methods/common/round_engine.py"
    by_module = {module: _accounts_summaries(tree) for module, tree in _modules(*NAME_USERS)}
    assert len(by_module[engine]) == 1
    in_methods = [
        f"{module}:{line}"
        for module, lines in by_module.items()
        if module != engine
        for line in lines
    ]
    assert not in_methods, f"a method adds the run's accounting itself: {in_methods}"
