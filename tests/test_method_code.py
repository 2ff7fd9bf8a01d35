"""Source checks over the two halves of every method, for mistakes no run shows: a message or
metric name spelled out where fedapp.messages names it (the halves agree by construction only
while both read the one constant), and a final report that adds the run's accounting twice."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import fedapp.messages

PACKAGE = Path(fedapp.messages.__file__).parent
#: Where message and metric names are written or read: the method halves and the two apps.
NAME_USERS = ("strategies", "clients", "server_app.py", "client_app.py")
#: Literals that equal a message name but name something else: (module, literal) -> what it is.
OTHER_MEANINGS = {
    ("strategies/scalefl.py", "level"): "summary.json's table of levels, numbered from 1",
    ("strategies/scalefl.py", "width"): "summary.json's table of levels: a level's width",
    ("clients/nas.py", "accuracy"): "a column of the NAS history the node keeps in its state",
}


def _message_names() -> dict[str, str]:
    """Value -> constant of every string constant fedapp.messages defines."""
    return {
        value: name
        for name, value in vars(fedapp.messages).items()
        if name.isupper() and isinstance(value, str)
    }


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


def _calls(function: ast.FunctionDef, owner: str, method: str) -> bool:
    """Whether ``function`` calls ``<owner>.<method>(...)`` (owner ``super()`` or a name)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            spelled = (
                "super()"
                if isinstance(target, ast.Call) and getattr(target.func, "id", "") == "super"
                else getattr(target, "id", "")
            )
            if spelled == owner and node.func.attr == method:
                return True
    return False


def test_a_final_report_built_on_its_parents_adds_no_accounting_of_its_own() -> None:
    """Every test_summary carries the accounting (and writes communication.csv): one that
    extends its parent's already has it, and adding it again writes the file twice."""
    reports = [
        (module, node)
        for module, tree in _modules("strategies")
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "test_summary"
    ]
    assert any(
        module == "strategies/base.py" and _calls(node, "self", "accounting_summary")
        for module, node in reports
    )
    doubled = [
        f"{module}:{node.lineno}"
        for module, node in reports
        if _calls(node, "super()", "test_summary") and _calls(node, "self", "accounting_summary")
    ]
    assert not doubled, f"test_summary adds the accounting its parent added: {doubled}"
