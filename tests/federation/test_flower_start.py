"""fedapp's strategies are Flower strategies: the ServerApp's rounds go through
``Strategy.start``, and docs/flower-strategies.md's ServerApp of another project runs a fedapp
method with Flower's own loop and grid, to the same final arrays as fedapp's ServerApp."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch
from local_grid import LocalGrid, preset_overrides, run_config, run_local, server_context

from fedapp.apps.client_app import app as client_app
from fedapp.methods.common.strategy import build_strategy
from fedapp.run.config import parse_run_config
from fedapp.run.profiles import NodeRegistry
from fedapp.wire.records import from_record

DOC = Path(__file__).resolve().parents[2] / "docs" / "flower-strategies.md"
#: HeteroFL (a width per node) on the digits smoke preset; resnet18-small at 8x8 costs 23,861 to
#: 4,103,264 MACs per width, so the budgets spread the nodes over the widths.
HETEROFL_DIGITS = preset_overrides("fedavg-digits") | {
    "strategy": "heterofl",
    "fraction_train": 1.0,
    "num_server_rounds": 2,
    "budget_min": 3e4,
    "budget_max": 5e6,
    "allocation_cap": 4.2e6,
    "partitioner": "budget-dirichlet",
}


def _documented_server_app() -> object:
    """The ServerApp of docs/flower-strategies.md, exactly as written there."""
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, f"{DOC} has no python block"
    namespace: dict[str, object] = {}
    exec(compile(block.group(1), str(DOC), "exec"), namespace)
    return namespace["app"]


def test_another_flower_apps_server_runs_a_fedapp_method_to_fedapps_result(tmp_path) -> None:
    config = run_config(**HETEROFL_DIGITS | {"out_dir": str(tmp_path), "run_name": "fedapp"})
    summary, _ = run_local(config, 4)
    ours = torch.load(Path(summary["run_dir"]) / "model_final.pt", weights_only=True)

    context = server_context(config)
    _documented_server_app()(LocalGrid(client_app, config, 4), context)
    theirs = from_record(context.state.array_records["final"])

    assert set(theirs) == set(ours)
    for name, array in theirs.items():
        np.testing.assert_array_equal(array, ours[name].cpu().numpy(), err_msg=name)
    initial = build_strategy(parse_run_config(config), NodeRegistry(4)).initial_state()
    assert any(not np.array_equal(array, initial[name]) for name, array in theirs.items())


def test_the_server_apps_rounds_are_flowers_strategy_start(tmp_path, caplog) -> None:
    """Flower's loop announces itself and each of its rounds; fedapp's row of each round
    follows it."""
    config = run_config(**HETEROFL_DIGITS | {"out_dir": str(tmp_path)})
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_local(config, 4)
    text = caplog.text
    assert "Starting HeteroFLStrategy strategy" in text
    assert text.index("[ROUND 1/2]") < text.index("round 1/2 | clients 4/4")
    assert text.index("[ROUND 2/2]") < text.index("round 2/2 | clients 4/4")
