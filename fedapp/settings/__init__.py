"""Run-config sections: the settings that one method (or two sharing their halves) reads.

A section is a frozen dataclass whose keys appear in the run config as ``<section>.<key>``
(``[tool.flwr.app.config.<section>]`` in pyproject.toml, which Flower flattens to dotted keys).
The method table names each method's section; ``fedapp.config`` parses them all.
"""
