"""Faults a real edge federation meets, and what the run must do about them.

- a SuperNode killed mid-round (real processes, three nodes, ``round-timeout`` 600 s): the round
  completes with the other two as soon as the SuperLink declares the node gone, and the run
  finishes;
- nodes that return malformed or non-finite arrays (in-process Grid, reply hooks): their replies
  are dropped and logged, and the global model stays finite through a whole run;

(The server killed mid-run and the run resumed: test_crash_resume.py.)

Flower 1.42 notices a vanished SuperNode only through heartbeats: each one keeps the node online
for 2 x 30 s, and one is sent every 17.5-22.5 s, so the node drops out 37.5-60 s after it died.
Then ``get_node_ids()`` no longer lists it and its pending message comes back as a
NODE_UNAVAILABLE error; the server's round loop (fedapp.run.exchange) stops waiting at that point.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, Message
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE
from local_grid import LocalGrid, preset_overrides, run_config, server_context
from processes import (
    REPO_DIR,
    Federation,
    flwr_run_command,
    managed_processes,
    preset_with,
    read_rounds,
)

from fedapp.apps.client_app import app as client_app
from fedapp.apps.server_app import app as server_app

#: A normal deployment round takes a few seconds here; the resume test bounds waits by this.
ROUND_TIMEOUT = 25.0
#: The longest a killed SuperNode stays "online" on the SuperLink in Flower 1.42: its last
#: heartbeat extended the node's online window by HEARTBEAT_PATIENCE x the default interval.
DETECTION_SECONDS = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL


def _digits(out: Path, run_name: str, rounds: int, **extra: Any) -> dict[str, Any]:
    return {
        "num-clients": 2,
        "num-server-rounds": rounds,
        "out-dir": str(out),
        "run-name": run_name,
        "round-timeout": ROUND_TIMEOUT,
    } | extra


def _wait_for_text(log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (log.exists() and text in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{text!r} not in {log}"
        time.sleep(0.1)


def test_node_killed_mid_round_costs_flowers_detection_time_not_the_round_timeout(
    tmp_path: Path,
) -> None:
    """One of three SuperNodes loses power while round 1 trains; round-timeout stays at its
    default of 600 s. The round ends with the other two once the SuperLink declares the node
    offline (heartbeats lapsed), and round 2 samples only the two that are left."""
    out = tmp_path / "out"
    with managed_processes(tmp_path) as procs:
        fed = Federation(procs, tmp_path)
        fed.connect()
        fed.start_superlink("--insecure")
        fed.start_supernode("sn0", 0, 3, "--insecure")
        fed.start_supernode("sn1", 1, 3, "--insecure")
        victim_log = fed.start_supernode("sn2", 2, 3, "--insecure")
        overrides = _digits(
            out,
            "kill-node",
            rounds=2,
            **{"num-clients": 3, "fraction-train": 1.0, "round-timeout": 600.0},
        )
        preset = preset_with(tmp_path, "fedavg-digits", overrides)
        run_log = procs.start(
            "flwr-run",
            flwr_run_command(["deploy", "--run-config", str(preset)]),
            fed.env,
            REPO_DIR,
        )
        _wait_for_text(victim_log, "Receiving: train message", timeout=180)
        procs.kill("sn2")  # the device loses power while training round 1
        assert procs.wait_exit("flwr-run", timeout=240) == 0, run_log.read_text()[-4000:]

    rows = read_rounds(out / "kill-node")
    assert [r["round"] for r in rows] == [1, 2], run_log.read_text()[-4000:]
    counts = [(r["clients-sampled"], r["clients-accepted"], r["clients-dropped"]) for r in rows]
    assert counts == [(3, 2, 1), (2, 2, 0)], rows
    # ended by Flower's detection (the SuperLink's online window), far from round-timeout
    assert rows[0]["seconds"] < DETECTION_SECONDS + 30, rows[0]
    summary = json.loads((out / "kill-node" / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.5
    assert "round 1/2 | clients 2/3" in run_log.read_text()


def test_round_stops_waiting_for_a_node_that_left_the_federation(tmp_path) -> None:
    """In-process: a node vanishes with its reply (the grid stops listing it, as the SuperLink
    does once it is declared offline); round-timeout is 600 s, yet both rounds complete, the
    first without it and the second with the nodes that are left."""
    config = run_config(
        **preset_overrides("fedavg-digits")
        | {
            "num_clients": 3,
            "fraction_train": 1.0,
            "num_server_rounds": 2,
            "round_timeout": 600.0,
            "out_dir": str(tmp_path),
            "run_name": "run",
        }
    )
    grid = LocalGrid(client_app, config, num_nodes=3, reply_hooks={2: lambda i, reply: None})
    server_app(grid=grid, context=server_context(config))
    rows = read_rounds(tmp_path / "run")
    counts = [(r["clients-sampled"], r["clients-accepted"], r["clients-dropped"]) for r in rows]
    assert counts == [(3, 2, 1), (2, 2, 0)]


def _inf_weights(index: int, reply: Message) -> Message:
    arrays = reply.content["arrays"]
    name = next(k for k, v in arrays.items() if len(v.shape) == 4)
    bad = arrays[name].numpy().copy()
    bad[0] = np.inf
    arrays[name] = Array(bad)
    return reply


def _nan_loss(index: int, reply: Message) -> Message:
    reply.content["metrics"]["train-loss"] = float("nan")
    return reply


def _renamed_layer(index: int, reply: Message) -> Message:
    arrays = reply.content["arrays"]
    name = next(iter(arrays))
    arrays["not-a-layer"] = Array(arrays[name].numpy())
    del arrays[name]
    return reply


def test_bad_replies_are_dropped_and_logged_and_the_model_stays_finite(tmp_path, caplog) -> None:
    """Three of five nodes misbehave every round of a whole run through the ServerApp."""
    config = run_config(
        **preset_overrides("fedavg-digits")
        | {
            "num_clients": 5,
            "fraction_train": 1.0,
            "num_server_rounds": 2,
            "out_dir": str(tmp_path),
            "run_name": "run",
        }
    )
    hooks = {1: _inf_weights, 2: _nan_loss, 3: _renamed_layer}
    grid = LocalGrid(client_app, config, num_nodes=5, reply_hooks=hooks)
    server_app(grid=grid, context=server_context(config))

    rows = read_rounds(tmp_path / "run")
    assert [(r["clients-accepted"], r["clients-dropped"]) for r in rows] == [(2, 3), (2, 3)]
    for reason in ("non-finite values", "metric train-loss is not finite", "wrong keys"):
        assert caplog.text.count(reason) == 2, reason  # once per round
    assert caplog.text.count("dropped reply of node") == 6
    for name in ("model_final.pt", "model_best.pt", "checkpoint.pt"):
        saved = torch.load(tmp_path / "run" / name, weights_only=True)
        state = saved.get("state", saved)
        assert all(torch.isfinite(v.double()).all() for v in state.values()), name
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert np.isfinite(summary["test_loss"]) and summary["test_accuracy"] > 0.5
