"""ServerApp: config -> run folder -> node handshake -> the method's rounds and final test (the
round engine, fedapp.methods.common.round_engine) -> summary and plots."""

from __future__ import annotations

import time
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedapp.data.registry import DatasetUnavailableError
from fedapp.evaluation.intervals import format_accuracy, summary_intervals
from fedapp.evaluation.labels import LABELS_FILE, write_label_distribution
from fedapp.evaluation.plots import plot_rounds
from fedapp.evaluation.results import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    ROUNDS_PLOT_FILE,
    SUMMARY_FILE,
    RunFileError,
    RunRecorder,
    read_json,
    run_folder_lock,
)
from fedapp.evaluation.tensorboard import INSTALL_HINT, tensorboard_available
from fedapp.method_table import folder_name
from fedapp.methods.common.round_engine import RoundEngine
from fedapp.methods.common.strategy import build_strategy
from fedapp.run.config import (
    ConfigError,
    RunConfig,
    config_differences,
    describe_differences,
    parse_run_config,
)
from fedapp.run.context import data_layout
from fedapp.run.federated_data import data_facts, population, server_set
from fedapp.run.profiles import NodeRegistry
from fedapp.wire.messages import SELECTION_KEY

app = ServerApp()


class RunRejected(Exception):
    """A user error stopped the run (bad run config, a node's rejection, missing data).

    An ordinary exception on purpose: Flower 1.42's ServerApp runner (``run_serverapp``) catches
    ``Exception`` only, and only then flushes the ServerApp's logs to the SuperLink, so that they
    reach ``flwr run --stream``, and marks the run ``finished:failed``. A ``SystemExit`` passes
    by that handler: the process ended with its last log lines unsent and the run was marked
    failed only when its heartbeat lapsed, with no reason shown.
    """


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one federated experiment; a user error stops it before training, with its reason as
    the log's last fedapp line."""
    try:
        cfg = parse_run_config(context.run_config)
        run_experiment(grid, cfg)
    except (ConfigError, DatasetUnavailableError, RunFileError) as err:
        log(ERROR, "fedapp: %s", err)
        raise RunRejected(str(err)) from None


def run_experiment(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    """The whole run, holding its folder's lock throughout (a second run into the folder is
    refused at once); returns the summary it also writes to summary.json."""
    started = time.perf_counter()
    if cfg.tensorboard and not tensorboard_available():
        raise ConfigError(
            f"run config 'tensorboard' = true needs the tensorboard package: {INSTALL_HINT}"
        )
    run_dir = RunRecorder.run_dir_for(
        cfg.resolved_out_dir(), cfg.run_name, folder_name(cfg.strategy), cfg.dataset
    )
    with run_folder_lock(run_dir):
        return _run_in(grid, cfg, run_dir, started)


def _run_in(grid: Grid, cfg: RunConfig, run_dir: Path, started: float) -> dict[str, Any]:
    _check_resumable(cfg, run_dir)
    layout = data_layout(cfg)
    validation = server_set(layout, "validation")  # loads the data: fails before anyone trains
    facts = data_facts(population(layout).info)
    nodes = NodeRegistry(cfg.num_clients, facts)
    nodes.wait_for(grid, cfg.num_clients, cfg.node_wait_timeout)
    strategy = build_strategy(cfg, nodes)
    engine = RoundEngine(strategy, run_dir, cfg.resume)
    first_round = engine.first_round
    recorder = RunRecorder(run_dir, resume_after=first_round - 1, tensorboard=cfg.tensorboard)
    recorder.write_json(CONFIG_FILE, cfg.as_saved_config())
    _write_labels(cfg, run_dir, nodes)
    log(
        INFO,
        "fedapp: %s on %s, %d clients (%d per round), rounds %d..%d -> %s",
        cfg.strategy,
        cfg.dataset,
        cfg.num_clients,
        cfg.cohort_size,
        first_round,
        cfg.num_server_rounds,
        run_dir,
    )
    setup_seconds = time.perf_counter() - started + engine.earlier_setup
    started -= engine.earlier_elapsed  # a resumed run's clock includes the rounds before the crash
    engine.run_rounds(grid, recorder, validation, started, setup_seconds)

    final_start = time.perf_counter()
    test = server_set(layout, "test")
    report = engine.final_test(recorder, test)
    best = engine.best
    timing = _timing(recorder.rows, setup_seconds, time.perf_counter() - final_start)
    summary = {
        "strategy": cfg.strategy,
        "dataset": cfg.dataset,
        "rounds": cfg.num_server_rounds,
        "resumed_from_round": first_round - 1,
        "best_round": best["round"],
        "best_val_accuracy": best[SELECTION_KEY],
        "wall_seconds": time.perf_counter() - started,
        "timing": timing,
        "fleet": strategy.fleet.summary(recorder.rows),
        "nodes": len(nodes.profiles),
        "node_profiles": [
            {
                "partition": p.partition_id,
                "device": p.device,
                "budget": p.budget,
                "examples": p.num_examples,
            }
            for p in sorted(nodes.profiles.values(), key=lambda p: p.partition_id)
        ],
        "run_dir": str(run_dir),
    } | report
    # Every test accuracy with its 95 % interval, from the final figures of whatever method.
    summary |= summary_intervals(summary, len(test.labels))
    recorder.write_json(SUMMARY_FILE, summary)
    recorder.log_test(summary)
    plot_rounds(
        run_dir / ROUNDS_PLOT_FILE, recorder.rows, SELECTION_KEY, f"{cfg.strategy} on {cfg.dataset}"
    )
    fleet = summary["fleet"]
    log(
        INFO,
        "fleet time: %.3f hours on %s, %s (%d late, %d surplus replies dropped)",
        fleet["hours"],
        "the measured rounds" if fleet["clock"] == "wall" else f"fleet {fleet['file']!r}",
        fleet["policy"],
        fleet["clients_late"],
        fleet["clients_surplus"],
    )
    log(
        INFO,
        "fedapp: test accuracy %s (best validation round %d); results in %s",
        format_accuracy(summary["test_accuracy"], summary.get("test_accuracy_ci95")),
        best["round"],
        run_dir,
    )
    return summary


def _check_resumable(cfg: RunConfig, run_dir: Path) -> None:
    """Refuse, before anything in it is rewritten, to start afresh in a run folder that holds a
    run's results, and to resume one made with another configuration: either would overwrite or
    mix two experiments in one set of files. Only the placement keys
    (``fedapp.run.config.PLACEMENT_KEYS``) may differ from the folder's config.json."""
    if not cfg.resume:
        held = [name for name in (SUMMARY_FILE, CHECKPOINT_FILE) if (run_dir / name).exists()]
        if held:
            raise ConfigError(
                f"{run_dir} already holds a run ({', '.join(held)}): set 'resume' = true to "
                "continue it, or give another 'run-name'; nothing in it was changed"
            )
        return
    if not (run_dir / CONFIG_FILE).exists():
        if (run_dir / CHECKPOINT_FILE).exists():
            raise ConfigError(
                f"'resume' = true, but {run_dir} has a {CHECKPOINT_FILE} and no {CONFIG_FILE}: "
                "which configuration it continues cannot be checked"
            )
        return
    differences = config_differences(read_json(run_dir / CONFIG_FILE), cfg)
    if differences:
        raise ConfigError(
            f"'resume' = true, but {run_dir} was run with another config: "
            f"{describe_differences(differences)}. Resume it with the config it was run with, "
            "or give another 'run-name' to start a new run; nothing in it was changed"
        )


def _write_labels(cfg: RunConfig, run_dir: Path, nodes: NodeRegistry) -> None:
    """labels.csv and labels.png of the seeded split, which the server computes as every
    simulated client does. A node that trains on files of its own (node config ``data-path``)
    reports another number of examples; its row then shows a shard it does not use, and a
    warning says so (the server never sees a node's labels)."""
    pop = population(data_layout(cfg))
    title = f"{cfg.dataset}, {cfg.partitioner} split: labels per client"
    counts = write_label_distribution(
        run_dir, pop.dataset.train.labels, pop.shards, pop.info.num_classes, title
    )
    sizes = counts.sum(axis=1)
    own = sorted(
        p.partition_id
        for p in nodes.profiles.values()
        if p.partition_id in sizes.index and p.num_examples != sizes[p.partition_id]
    )
    if own:
        log(
            WARNING,
            "fedapp: %s shows the seeded split; partitions %s train on data of their own",
            LABELS_FILE,
            own,
        )


def _timing(rows: list[dict[str, Any]], setup: float, final: float) -> dict[str, float]:
    """Where the server's wall time went (client training is the sum over clients' own clocks,
    which overlap when clients run in parallel)."""
    total = {
        key: float(sum(r.get(key, 0.0) for r in rows))
        for key in (
            "seconds-train-phase",
            "seconds-aggregate",
            "seconds-evaluate",
            "seconds-client-training-sum",
            "seconds",
        )
    }
    return {
        "setup_seconds": setup,
        "rounds_seconds": total["seconds"],
        "train_phase_seconds": total["seconds-train-phase"],
        "client_training_seconds_sum": total["seconds-client-training-sum"],
        "aggregate_seconds": total["seconds-aggregate"],
        "validation_seconds": total["seconds-evaluate"],
        "final_evaluation_seconds": final,
    }
