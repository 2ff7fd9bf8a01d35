"""Optional dependencies: the extra of fedapp that brings a lazily imported package.

A device's base install (``pip install fedapp``) trains on its own files (node config
``data-path``) and lacks what cutting a shard of a shared data set needs: the partitioners
(flwr-datasets), the embedded and Hugging Face data sets, and the server's tables and figures
(pandas, matplotlib); the ``data`` extra brings them. Code that uses them imports them inside
``with needs_extra("data", "<what for>"):``, so a node without them says which install it lacks
instead of showing a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: The extra that brings the partitioners, the embedded and hub data sets, tables and figures.
DATA = "data"
#: The extra that brings the ONNX exporter and runtime (fedapp export).
EXPORT = "export"


class MissingExtraError(ImportError):
    """A package that one of fedapp's extras brings is not installed here."""

    def __init__(self, extra: str, purpose: str, module: str | None) -> None:
        super().__init__(
            f"{purpose} needs the Python package {module!r}, which this install lacks: "
            f'pip install "fedapp[{extra}]" (in a checkout: pip install -e ".[{extra}]")',
            name=module,
        )
        self.extra = extra


@contextmanager
def needs_extra(extra: str, purpose: str) -> Iterator[None]:
    """Imports in this block come with ``extra``; a missing one raises ``MissingExtraError``
    naming the install, where ``purpose`` says what needed it (e.g. "data set 'mnist-5k'")."""
    try:
        yield
    except ModuleNotFoundError as error:
        top = error.name.split(".")[0] if error.name else None
        raise MissingExtraError(extra, purpose, top) from error
