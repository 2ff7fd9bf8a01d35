"""What a setting is: a typed field with its check, and the section that groups a method's keys.

Kept below ``fedapp.run.config`` so that the run-wide keys and every method's section are declared
and checked the same way, each check beside its field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field
from typing import Any, ClassVar

#: (predicate, what is allowed); the description may be a callable, read only on an error.
Check = tuple[Callable[[Any], bool], str | Callable[[], str]]
#: A list of allowed names, or a callable giving it (file listings are read only when checked).
Names = tuple[str, ...] | Callable[[], tuple[str, ...]]


def one_of(names: Names) -> Check:
    def listed() -> tuple[str, ...]:
        return names() if callable(names) else names

    return (lambda v: v in listed(), lambda: "one of " + ", ".join(repr(n) for n in listed()))


def at_least(low: float) -> Check:
    return (lambda v: v >= low, f">= {low:g}")


def positive() -> Check:
    return (lambda v: v > 0, "> 0")


def fraction(low_open: bool, high: float, high_open: bool) -> Check:
    """A value between 0 and ``high``, each end open or closed as written in the message."""
    text = f"in {'(' if low_open else '['}0, {high:g}{')' if high_open else ']'}"
    return (
        lambda v: (v > 0 if low_open else v >= 0) and (v < high if high_open else v <= high),
        text,
    )


def setting(check: Check | None = None, *, protocol: bool = False) -> Any:
    """A run-config field: its check, and whether it defines the experiment that every method
    of a comparison must share (``protocol``)."""
    return field(metadata={"check": check, "protocol": protocol})


def check_of(declared: Field) -> Check | None:
    return declared.metadata.get("check")


def is_protocol(declared: Field) -> bool:
    return bool(declared.metadata.get("protocol"))


def key_of(field_name: str) -> str:
    """Run-config key of a dataclass field (``lambda_`` -> ``lambda``, ``grid_points`` ->
    ``grid-points``)."""
    return field_name.rstrip("_").replace("_", "-")


@dataclass(frozen=True)
class Section:
    """A method's settings; subclasses name the section and declare its fields with
    :func:`setting` (no defaults: those live in pyproject.toml only)."""

    #: The section's name: its keys are ``<name>.<key>``.
    name: ClassVar[str]

    def cross_checks(self, strategy: str, run: Mapping[str, Any]) -> list[str]:
        """Problems between this section and the run-wide keys (``run``: key -> value), when
        ``strategy`` is a method of this section."""
        return []
