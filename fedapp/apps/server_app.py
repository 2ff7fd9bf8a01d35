"""ServerApp: config -> node handshake -> ``Strategy.start``'s rounds -> final evaluation ->
result files."""

from __future__ import annotations

import json
import time
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedapp.data.registry import DatasetUnavailableError, ImageArrays
from fedapp.evaluation.intervals import format_accuracy, summary_intervals
from fedapp.evaluation.labels import LABELS_FILE, write_label_distribution
from fedapp.evaluation.operating_points import announce_points
from fedapp.evaluation.plots import plot_rounds
from fedapp.evaluation.results import (
    BEST_MODEL_FILE,
    CHECKPOINT_FILE,
    CONFIG_FILE,
    FINAL_MODEL_FILE,
    ROUNDS_PLOT_FILE,
    SUMMARY_FILE,
    RunFileError,
    RunRecorder,
    read_json,
    run_folder_lock,
    unreadable,
)
from fedapp.evaluation.tensorboard import INSTALL_HINT, tensorboard_available
from fedapp.methods.common.strategy import HeterogeneousStrategy, State, build_strategy
from fedapp.run.config import (
    ConfigError,
    RunConfig,
    config_differences,
    describe_differences,
    parse_run_config,
)
from fedapp.run.context import data_layout
from fedapp.run.exchange import PromptGrid
from fedapp.run.federated_data import data_facts, population, server_set
from fedapp.run.profiles import NodeRegistry
from fedapp.wire.messages import SELECTION_KEY, TRAIN_LOSS
from fedapp.wire.records import from_record, to_record

#: A round's heaviest clients (strategies send them first), pushed ahead of the rest so they
#: start first: a round cannot end before its heaviest client, and Flower's simulation engine
#: would otherwise start clients in node order, so that an actor idles while another finishes a
#: client that started last (measured in docs/performance.md, "Where the quickstart's time
#: goes"). Two: wherever a round is worth shortening, its clients run on at least two actors or
#: devices. The order changes no result: replies are aggregated in partition order.
LEADING_CLIENTS = 2

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
        cfg.resolved_out_dir(), cfg.run_name, cfg.strategy, cfg.dataset
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
    first_round, state, best, earlier = _starting_point(cfg, strategy, run_dir)
    recorder = RunRecorder(run_dir, resume_after=first_round - 1, tensorboard=cfg.tensorboard)
    recorder.write_json(CONFIG_FILE, cfg.as_run_config())
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
    setup_seconds = time.perf_counter() - started + earlier["setup"]
    started -= earlier["elapsed"]  # a resumed run's clock includes the rounds before the crash
    round_end = RoundEnd(cfg, strategy, recorder, validation, state, best, started, setup_seconds)
    strategy.rounds_done = first_round - 1
    strategy.start(
        grid=PromptGrid(grid, lead=LEADING_CLIENTS),
        initial_arrays=to_record(state),
        num_rounds=cfg.num_server_rounds - strategy.rounds_done,
        timeout=cfg.round_timeout,
        evaluate_fn=round_end,
    )
    state, best = round_end.state, round_end.best

    recorder.save_state(FINAL_MODEL_FILE, state)
    best_state = RunRecorder.load_state(run_dir / BEST_MODEL_FILE)
    final_start = time.perf_counter()
    test = server_set(layout, "test")
    with announce_points("final test"):
        report = strategy.test_summary(best_state, test, run_dir)
    report |= strategy.accounting.summary(run_dir, strategy.params_by_client(best_state))
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


def _starting_point(
    cfg: RunConfig, strategy: HeterogeneousStrategy, run_dir: Path
) -> tuple[int, State, dict[str, Any], dict[str, float]]:
    """Round 1 from the initial state, or the round after the checkpoint when resuming; also
    the best round so far and the setup and elapsed seconds of the run before this start. A
    resumed strategy continues its accounting (communication, compute, metering, method
    records) from the checkpoint, so summary.json covers the whole run."""
    nothing_earlier = {"setup": 0.0, "elapsed": 0.0}
    fresh = (1, strategy.initial_state(), {"round": 0, SELECTION_KEY: -1.0}, nothing_earlier)
    if not cfg.resume:
        return fresh
    try:
        done, state, extra = RunRecorder.load_checkpoint(run_dir)
    except FileNotFoundError:
        log(WARNING, "fedapp: resume = true but %s has no checkpoint; starting at round 1", run_dir)
        return fresh
    log(INFO, "fedapp: resuming %s after round %d", run_dir, done)
    if (run_dir / BEST_MODEL_FILE).exists():  # the final test reads it: a torn one fails now
        RunRecorder.load_state(run_dir / BEST_MODEL_FILE)
    try:
        accounts = json.loads(extra["accounts"])
        earlier = {"setup": float(extra["setup"]), "elapsed": float(extra["elapsed"])}
        best = dict(extra["best"])
    except (KeyError, TypeError, ValueError) as err:
        raise unreadable(
            run_dir / CHECKPOINT_FILE, f"not a checkpoint fedapp wrote: {err!r}"
        ) from None
    strategy.restore_accounts(accounts)
    return done + 1, state, best, earlier


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


def _plain(value: Any) -> Any:
    """numpy scalars and arrays in a method's records as JSON values."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint")


class RoundEnd:
    """What the run does after each of ``Strategy.start``'s rounds (its ``evaluate_fn``): the
    round's row of metrics.jsonl, validation on the run's cadence (keeping the best state), the
    checkpoint a resumed run continues from, and the progress line."""

    def __init__(
        self,
        cfg: RunConfig,
        strategy: HeterogeneousStrategy,
        recorder: RunRecorder,
        validation: ImageArrays,
        state: State,
        best: dict[str, Any],
        started: float,
        setup_seconds: float,
    ) -> None:
        self.cfg = cfg
        self.strategy = strategy
        self.recorder = recorder
        self.validation = validation
        self.state = state  # the global state after the last finished round
        self.best = best  # the round with the best validation selection metric so far
        self.started = started
        self.setup_seconds = setup_seconds

    def __call__(self, start_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Round ``start_round`` of this start has ended (0: before the first, nothing to do)."""
        if start_round == 0:
            return None
        server_round = start_round + self.strategy.rounds_done
        self.state = from_record(arrays)
        row = _round_row(self.strategy, server_round)
        validation: dict[str, float] = {}
        if server_round % self.cfg.eval_every == 0 or server_round == self.cfg.num_server_rounds:
            evaluation_start = time.perf_counter()
            validation = self.strategy.validation_metrics(self.state, self.validation)
            row |= validation
            row["seconds-evaluate"] = time.perf_counter() - evaluation_start
            if row[SELECTION_KEY] > self.best[SELECTION_KEY]:
                self.best = {"round": server_round, SELECTION_KEY: row[SELECTION_KEY]}
                self.recorder.save_state(BEST_MODEL_FILE, self.state)
        row["seconds"] = time.perf_counter() - self.strategy.report.started
        self.recorder.log_round(row)
        self.recorder.save_checkpoint(
            server_round,
            self.state,
            {
                "best": self.best,
                "accounts": json.dumps(self.strategy.accounts(), default=_plain),
                "elapsed": time.perf_counter() - self.started,
                "setup": self.setup_seconds,
            },
        )
        _log_progress(self.cfg, row)
        return MetricRecord(validation) if validation else None


def _round_row(strategy: HeterogeneousStrategy, server_round: int) -> dict[str, Any]:
    """What happened in a training round: its clients, its phases' seconds, its traffic and
    the clients' example-weighted metrics."""
    report = strategy.report
    row: dict[str, Any] = {
        "round": server_round,
        "clients-sampled": report.sampled,
        "clients-accepted": report.accepted,
        "clients-dropped": len(report.dropped),
        "seconds-train-phase": report.aggregate_started - report.started,
        "seconds-aggregate": report.aggregate_ended - report.aggregate_started,
        "seconds-client-training-sum": report.client_seconds,
        "seconds-client-training-max": report.client_seconds_max,
    }
    row["bytes-down"], row["bytes-up"] = strategy.accounting.ledger.round_bytes(server_round)
    metrics = strategy.round_metrics
    if metrics is not None:
        row |= {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    return row


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


def _log_progress(cfg: RunConfig, row: dict[str, Any]) -> None:
    accuracy = f"{100 * row[SELECTION_KEY]:.2f}%" if SELECTION_KEY in row else "-"
    loss = f"{row[TRAIN_LOSS]:.4f}" if TRAIN_LOSS in row else "-"
    log(
        INFO,
        "round %d/%d | clients %d/%d | train loss %s | val acc %s | %.1f s",
        row["round"],
        cfg.num_server_rounds,
        row["clients-accepted"],
        row["clients-sampled"],
        loss,
        accuracy,
        row["seconds"],
    )
