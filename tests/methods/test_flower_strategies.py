"""Flower's own strategies (``flwr:<name>``) on fedapp's round engine: every one runs two rounds
on digits and writes its result files; FedAvg through Flower's rule is fedapp's FedAvg; a server
optimiser's state survives a crash exactly; Bulyan is refused where the cohort is too small;
FedProx's proximal term is applied in the client; the settings' defaults are Flower's."""

from __future__ import annotations

import inspect
import json
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import strategy as flower
from local_grid import (
    APP_DIR,
    PowerCut,
    crash_in_round,
    preset_overrides,
    run_config,
    run_local,
    server_context,
)
from processes import read_rounds

from fedapp.evaluation.results import CHECKPOINT_FILE, FINAL_MODEL_FILE, RunFileError, RunRecorder
from fedapp.method_table import FLOWER_STRATEGIES, settings_class
from fedapp.methods.fedavg import client as fedavg_client
from fedapp.methods.flower import client as flower_client
from fedapp.methods.flower.keys import PROXIMAL_MU
from fedapp.methods.flower.server import RULES
from fedapp.models.zoo import build_model
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import run_context
from fedapp.run.profiles import local_node
from fedapp.sections import key_of
from fedapp.wire.messages import ARRAYS, CONFIG, LEARNING_RATE, SERVER_ROUND
from fedapp.wire.records import to_record

NODES = 3
#: Three clients, all in both rounds: Bulyan's default (no Byzantine client) needs 3 replies.
FLOWER_DIGITS = preset_overrides("fedavg-digits") | {
    "num_clients": NODES,
    "fraction_train": 1.0,
    "num_server_rounds": 2,
}


def _config(tmp_path: Path, strategy: str, name: str, **extra: Any) -> dict[str, Any]:
    folder = {"out_dir": str(tmp_path), "run_name": name}
    return run_config(**FLOWER_DIGITS | {"strategy": strategy} | folder | extra)


def _final_model(run_dir: Path) -> dict[str, np.ndarray]:
    return RunRecorder.load_state(run_dir / FINAL_MODEL_FILE)


@pytest.mark.parametrize("name", list(FLOWER_STRATEGIES))
def test_every_flower_strategy_runs_two_rounds_on_digits(tmp_path, name) -> None:
    config = _config(tmp_path, f"flwr:{name}", name)
    summary, _ = run_local(config, num_nodes=NODES)

    run_dir = tmp_path / name
    assert summary["strategy"] == f"flwr:{name}" and summary["rounds"] == 2
    rows = read_rounds(run_dir)
    assert [r["clients-accepted"] for r in rows] == [NODES, NODES]
    assert all(0 <= r["val-accuracy"] <= 1 for r in rows)
    assert 0 <= summary["test_accuracy"] <= 1 and summary["test_examples"] == 300
    assert summary["comm"]["client_rounds"] == 2 * NODES
    for file in ("summary.json", "config.json", "communication.csv", "accuracy.png"):
        assert (run_dir / file).is_file(), file
    final = _final_model(run_dir)
    assert all(np.isfinite(v).all() for v in final.values())
    # the state keeps its dtypes: float parameters stay float32, BN step counters integers
    run = run_context(parse_run_config(config))
    initial = build_model(run.model, run.info)
    assert {k: v.dtype for k, v in final.items()} == {
        k: v.numpy().dtype for k, v in initial.state_dict().items()
    }


def test_fedavg_through_flowers_rule_is_fedapps_fedavg(tmp_path) -> None:
    one_round = {"num_server_rounds": 1}
    ours, _ = run_local(_config(tmp_path, "fedavg", "ours", **one_round), num_nodes=NODES)
    theirs, _ = run_local(_config(tmp_path, "flwr:fedavg", "theirs", **one_round), num_nodes=NODES)

    a, b = _final_model(tmp_path / "ours"), _final_model(tmp_path / "theirs")
    assert set(a) == set(b)
    for name in a:  # the same weighted sum in another order: equal up to float32 rounding
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6)
    assert ours["comm"] == theirs["comm"]  # the same seeded cohort and payloads


@pytest.mark.parametrize(
    ("name", "settings", "state"),
    [
        ("fedadam", {}, ("m_t", "v_t")),
        ("fedavgm", {"flwr_fedavgm__server_momentum": 0.9}, ("momentum_vector",)),
    ],
)
def test_a_resumed_run_with_a_server_optimiser_is_exact(tmp_path, name, settings, state) -> None:
    run_local(_config(tmp_path, f"flwr:{name}", "whole", **settings), num_nodes=NODES)
    with pytest.raises(PowerCut):
        hooks = dict.fromkeys(range(NODES), crash_in_round(2))
        run_local(_config(tmp_path, f"flwr:{name}", "cut", **settings), NODES, reply_hooks=hooks)
    _, _, extra = RunRecorder.load_checkpoint(tmp_path / "cut")
    kept = json.loads(extra["accounts"])["server_optimiser"]
    assert set(kept) == set(state) and all(kept[k] is not None for k in state)

    checkpoint = tmp_path / "cut" / CHECKPOINT_FILE
    kept_bytes = checkpoint.read_bytes()
    saved = torch.load(checkpoint, weights_only=True)
    saved["extra"]["accounts"] = json.dumps(
        json.loads(saved["extra"]["accounts"]) | {"server_optimiser": {state[0]: "garbage"}}
    )
    torch.save(saved, checkpoint)
    resume = _config(tmp_path, f"flwr:{name}", "cut", resume=True, **settings)
    with pytest.raises(RunFileError, match=r"checkpoint\.pt is torn or corrupt"):
        run_local(resume, num_nodes=NODES)
    checkpoint.write_bytes(kept_bytes)

    resumed, _ = run_local(resume, num_nodes=NODES)

    assert resumed["resumed_from_round"] == 1
    whole, cut = _final_model(tmp_path / "whole"), _final_model(tmp_path / "cut")
    for key in whole:
        np.testing.assert_array_equal(whole[key], cut[key])


def test_bulyan_is_refused_where_the_cohort_is_too_small(tmp_path) -> None:
    config = _config(tmp_path, "flwr:bulyan", "b", flwr_bulyan__num_malicious_nodes=1)
    with pytest.raises(ConfigError, match=r"4 \* 'flwr-bulyan.num-malicious-nodes' \+ 3 = 7"):
        parse_run_config(config)
    with pytest.raises(ConfigError, match="the cohort is 3 clients"):
        parse_run_config(config)
    bigger = _config(
        tmp_path, "flwr:bulyan", "b", num_clients=7, flwr_bulyan__num_malicious_nodes=1
    )
    assert parse_run_config(bigger).cohort_size == 7


def _train_message(state: dict[str, np.ndarray], **config: float) -> Message:
    settings = ConfigRecord({SERVER_ROUND: 1, LEARNING_RATE: 0.05, **config})
    content = RecordDict({ARRAYS: to_record(state), CONFIG: settings})
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN)


def test_fedprox_pulls_the_local_update_towards_the_received_model(tmp_path) -> None:
    config = _config(tmp_path, "flwr:fedprox", "p")
    server_context(config)
    run = run_context(parse_run_config(config))
    node = local_node({"partition-id": 0, "num-partitions": NODES}, run.data)
    torch.manual_seed(0)
    received = {
        k: v.numpy().copy() for k, v in build_model(run.model, run.info).state_dict().items()
    }

    def moved(reply: RecordDict) -> float:
        sent = {k: v.numpy() for k, v in reply[ARRAYS].items()}
        return sum(float(np.sum((sent[k] - received[k]) ** 2)) for k in received if "weight" in k)

    plain = flower_client.train(_train_message(received, **{PROXIMAL_MU: 0.0}), run, node)
    fedavg = fedavg_client.train(_train_message(received), run, node)
    pulled = flower_client.train(_train_message(received, **{PROXIMAL_MU: 2.0}), run, node)

    for name, value in plain[ARRAYS].items():  # mu = 0 is FedAvg's local update, exactly
        np.testing.assert_array_equal(value.numpy(), fedavg[ARRAYS][name].numpy())
    assert 0 < moved(pulled) < 0.9 * moved(plain)
    with pytest.raises(ValueError, match="proximal-mu"):
        flower_client.train(_train_message(received, **{PROXIMAL_MU: -1.0}), run, node)


def test_the_fedprox_server_sends_flowers_proximal_mu(tmp_path) -> None:
    config = _config(tmp_path, "flwr:fedprox", "p", flwr_fedprox__proximal_mu=0.3)
    _, grid = run_local(config | {"num-server-rounds": 1}, num_nodes=NODES)
    sent = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert [m.content[CONFIG][PROXIMAL_MU] for m in sent] == [0.3] * NODES


def test_each_setting_defaults_to_flowers_own() -> None:
    defaults = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    for name in FLOWER_STRATEGIES:
        signature = inspect.signature(RULES[name].__init__).parameters
        kind = settings_class(f"flwr:{name}")
        declared = [] if kind is None else fields(kind)
        for declared_field in declared:
            ours = defaults["config"][kind.name][key_of(declared_field.name)]
            assert ours == signature[declared_field.name].default, (name, declared_field.name)
    assert set(RULES) == set(FLOWER_STRATEGIES)
    assert RULES["bulyan"] is flower.Bulyan
