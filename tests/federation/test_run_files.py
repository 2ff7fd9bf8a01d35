"""What a run leaves for people to read: ``load_run``, ``fedapp show``, the TensorBoard events
(``tensorboard = true``) and the label distribution (``labels.csv``, ``labels.png``).

One real two-round FEAST run on the digits under Dirichlet(0.1), with TensorBoard on, serves the
tests of this module (the app's real ClientApp in process, as in test_resume); it trains the
smallest variant only, to stay cheap, and still serves and tests every operating point."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from digits_runs import DIGITS_FEAST
from local_grid import run_config, run_local
from processes import read_rounds

from fedapp.evaluation.intervals import format_accuracy
from fedapp.evaluation.labels import LABELS_FILE, LABELS_PLOT_FILE, write_label_distribution
from fedapp.evaluation.results import RunRecorder
from fedapp.evaluation.tensorboard import TENSORBOARD_DIR, scalar_tag
from fedapp.results import load_run
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import data_layout
from fedapp.run.federated_data import client_shard, population
from fedapp.tools import cli

ROUNDS, NODES = 2, 4


def _config(out: Path, name: str, **extra: Any) -> dict[str, Any]:
    return run_config(
        **DIGITS_FEAST
        | {
            "partitioner": "dirichlet",
            "dirichlet_alpha": 0.1,
            "num_clients": NODES,
            "fraction_train": 1.0,
            "num_server_rounds": ROUNDS,
            "eval_every": ROUNDS,  # the anchors' validation is the costliest part of a round
            "local_epochs": 1,
            "feast__training_rule": "min",  # one variant per batch: a quarter of the full work
            # shards of 241, 343, 399 and 264 digits: no last batch of one image, which batch
            # norm cannot train on (the default 16 leaves one of the 241)
            "batch_size": 32,
            "out_dir": str(out),
            "run_name": name,
        }
        | extra
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """(its run config, its folder) of one finished run with TensorBoard on."""
    out = tmp_path_factory.mktemp("runs")
    config = _config(out, "feast", tensorboard=True)
    run_local(config, num_nodes=NODES)
    return config, out / "feast"


# ---- load_run and fedapp show ------------------------------------------------------------------


def test_load_run_reads_every_file_of_a_real_run(run: tuple[dict[str, Any], Path]) -> None:
    _, run_dir = run
    loaded = load_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert loaded.summary == summary
    assert loaded.strategy == "feast" and loaded.test_accuracy == summary["test_accuracy"]
    assert loaded.test_interval == tuple(summary["test_accuracy_ci95"])
    assert loaded.config == json.loads((run_dir / "config.json").read_text())
    # one row per round, in order, with the values of metrics.jsonl
    rows = read_rounds(run_dir)
    assert loaded.metrics["round"].tolist() == list(range(1, ROUNDS + 1))
    assert loaded.metrics.columns[0] == "round"
    for key in ("train-loss", "val-accuracy", "bytes-down", "clients-accepted"):
        # NaN in rounds without validation (eval-every)
        expected = [row.get(key, np.nan) for row in rows]
        np.testing.assert_array_equal(loaded.metrics[key].to_numpy(dtype=float), expected)
    assert np.isnan(loaded.metrics["val-accuracy"][0])
    # the operating points' table is variants.csv, the summary's points
    assert loaded.points is not None
    assert loaded.points["accuracy"].tolist() == [v["accuracy"] for v in summary["variants"]]
    assert loaded.population is not None and len(loaded.population) == NODES
    # a round's bytes in metrics.jsonl are those of its client-rounds in communication.csv
    assert loaded.communication is not None
    by_round = loaded.communication.groupby("round")[["bytes_down", "bytes_up"]].sum()
    assert loaded.metrics["bytes-down"].tolist() == by_round["bytes_down"].tolist()
    assert loaded.metrics["bytes-up"].tolist() == by_round["bytes_up"].tolist()
    assert min(by_round["bytes_down"]) > 0
    assert loaded.clients is None  # FEAST's models live on the server
    # each accepted client-round's metered work, by the device its node reported
    work = loaded.client_work
    assert work is not None and len(work) == len(loaded.communication)
    assert work[["round", "partition"]].values.tolist() == (
        loaded.communication[["round", "partition"]].values.tolist()
    )
    device = f"{platform.machine()}/cpu"
    assert set(work["device"]) == {device} and (work["seconds"] > 0).all()
    assert summary["work_by_device"][device]["client_rounds"] == len(work)
    assert summary["work_by_device"][device]["peak_rss_mb_max"] == work["peak_rss_mb"].max()
    assert [n["partition"] for n in summary["node_profiles"]] == list(range(NODES))
    assert {n["device"] for n in summary["node_profiles"]} == {device}
    assert loaded.labels is not None and len(loaded.labels) == NODES


def test_load_run_names_a_folder_that_is_no_finished_run(
    run: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    (tmp_path / "metrics.jsonl").write_text((run[1] / "metrics.jsonl").read_text())
    with pytest.raises(ValueError, match=f"{tmp_path} has no summary.json"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="no such folder"):
        load_run(tmp_path / "missing")
    assert cli.main(["show", str(tmp_path)]) == cli.EXIT_BAD_INPUT


def test_a_run_folder_without_a_methods_tables_loads_what_it_has(
    run: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    """Which CSVs a folder holds depends on its method: those it lacks load as None."""
    _, run_dir = run
    for name in ("summary.json", "config.json", "metrics.jsonl"):
        (tmp_path / name).write_text((run_dir / name).read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    loaded = load_run(tmp_path)
    assert loaded.summary == summary
    assert loaded.test_interval == pytest.approx(summary["test_accuracy_ci95"])
    assert loaded.points is None and loaded.labels is None  # files this folder lacks


def test_show_prints_the_summary_and_every_point(
    run: tuple[dict[str, Any], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, run_dir = run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert cli.main(["show", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert f"feast on digits, {ROUNDS} rounds" in text
    assert format_accuracy(summary["test_accuracy"], summary["test_accuracy_ci95"]) in text
    population_text = format_accuracy(
        summary["population_accuracy"], summary["population_accuracy_ci95"]
    )
    assert f"population   {population_text}" in text
    lines = text.splitlines()
    for point in summary["variants"]:
        accuracy = format_accuracy(point["accuracy"], [point["ci95_low"], point["ci95_high"]])
        untrained = "" if point["trained"] else "  (no client trained it directly)"
        line = f"{point['index']:>5} {point['macs']:>13,} {point['params']:>11,}  {accuracy}"
        assert line + untrained in lines
    assert {p["trained"] for p in summary["variants"]} == {True, False}  # both kinds of line
    work = summary["work_by_device"][f"{platform.machine()}/cpu"]
    assert f"work         {platform.machine()}/cpu: {work['client_rounds']} client-rounds" in text

    assert cli.main(["show", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["strategy"] == "feast" and data["rounds"] == ROUNDS
    assert data["test_accuracy_ci95"] == summary["test_accuracy_ci95"]
    assert [p["accuracy"] for p in data["points"]] == [v["accuracy"] for v in summary["variants"]]


# ---- TensorBoard -------------------------------------------------------------------------------


def _events(run_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    return events


def test_tensorboard_scalars_are_the_rows_of_metrics_jsonl(
    run: tuple[dict[str, Any], Path],
) -> None:
    _, run_dir = run
    rows = read_rounds(run_dir)
    events = _events(run_dir)
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "round" and isinstance(value, int | float) and not isinstance(value, bool):
                expected.setdefault(scalar_tag(key), []).append((row["round"], float(value)))
    summary = json.loads((run_dir / "summary.json").read_text())
    expected["test/accuracy"] = [(ROUNDS, summary["test_accuracy"])]
    expected["test/population-accuracy"] = [(ROUNDS, summary["population_accuracy"])]
    for point in summary["variants"]:
        expected[f"test/point-{point['index']}"] = [(ROUNDS, point["accuracy"])]

    assert set(events.Tags()["scalars"]) == set(expected)
    for tag, values in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [step for step, _ in got] == [step for step, _ in values], tag
        np.testing.assert_allclose([v for _, v in got], [v for _, v in values], rtol=1e-6)
    # the sections a reader looks for, with FEAST's per-anchor validation accuracies
    for tag in ("training/train-loss", "validation/val-accuracy", "communication/bytes-up"):
        assert tag in expected
    assert any(tag.startswith("validation/val-acc-v") for tag in expected)


def test_resumed_run_purges_the_steps_after_its_checkpoint(tmp_path: Path) -> None:
    """A crash may leave events of a round after the checkpoint; the resumed run's events win,
    as its rows replace those in metrics.jsonl."""
    run_dir = tmp_path / "run"
    first = RunRecorder(run_dir, tensorboard=True)
    for step, loss in ((1, 2.0), (2, 1.5), (3, 1.2)):  # round 3 ran after the last checkpoint
        first.log_round({"round": step, "train-loss": loss})
    again = RunRecorder(run_dir, resume_after=2, tensorboard=True)
    again.log_round({"round": 3, "train-loss": 0.9})
    again.log_test({"rounds": 3, "test_accuracy": 0.8})
    got = [(e.step, e.value) for e in _events(run_dir).Scalars("training/train-loss")]
    assert got == [(1, 2.0), (2, 1.5), (3, pytest.approx(0.9))]
    assert [r["train-loss"] for r in read_rounds(run_dir)] == [2.0, 1.5, 0.9]


def test_tensorboard_without_the_package_stops_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    config = _config(tmp_path, "no-tb", tensorboard=True)
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[tensorboard\]"'):
        run_local(config, num_nodes=NODES)
    assert not (tmp_path / "no-tb").exists()


def test_tensorboard_key_is_off_by_default_and_typed() -> None:
    assert parse_run_config(run_config()).tensorboard is False
    with pytest.raises(ConfigError, match="'tensorboard' = 'yes': expected a bool"):
        parse_run_config(run_config(tensorboard="yes"))


# ---- label distribution ------------------------------------------------------------------------


def _skew(counts: pd.DataFrame) -> float:
    """Mean total-variation distance between a client's label shares and the pool's."""
    shares = counts.to_numpy(dtype=float)
    pool = shares.sum(axis=0) / shares.sum()
    own = shares / shares.sum(axis=1, keepdims=True)
    return float(0.5 * np.abs(own - pool).sum(axis=1).mean())


def test_labels_csv_counts_each_clients_shard(run: tuple[dict[str, Any], Path]) -> None:
    config, run_dir = run
    cfg = parse_run_config(config)
    counts = pd.read_csv(run_dir / LABELS_FILE, index_col="partition")
    assert counts.index.tolist() == list(range(NODES))
    assert counts.columns.tolist() == [str(c) for c in range(10)]
    for partition in range(NODES):
        shard = client_shard(data_layout(cfg), partition)  # what that client trains on
        assert counts.loc[partition].sum() == len(shard.labels)
        assert counts.loc[partition].tolist() == np.bincount(shard.labels, minlength=10).tolist()
    assert (run_dir / LABELS_PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dirichlet_split_is_visibly_skewed_against_iid(
    run: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    config, run_dir = run
    dirichlet = pd.read_csv(run_dir / LABELS_FILE, index_col="partition")
    iid_cfg = parse_run_config(config | {"partitioner": "iid"})
    pop = population(data_layout(iid_cfg))
    iid = write_label_distribution(
        tmp_path, pop.dataset.train.labels, pop.shards, pop.info.num_classes, "iid"
    )
    assert iid.to_numpy().sum() == dirichlet.to_numpy().sum()  # the same pool, split two ways
    assert _skew(iid) < 0.1 < 0.4 < _skew(dirichlet)
    # under Dirichlet(0.1) most clients lack some class; under IID every client has every class
    assert (dirichlet == 0).any(axis=1).sum() >= NODES // 2
    assert not (iid == 0).to_numpy().any()
