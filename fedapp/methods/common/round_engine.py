"""The rounds of every method: where a run starts (round 1, or after its checkpoint), Flower's
``Strategy.start`` over them, and after each round its row of metrics.jsonl, validation on the
run's cadence (keeping the best state), the checkpoint a resumed run continues from and the
progress line; then the one test of the selected state. A method supplies only what its strategy
defines (initial state, payloads, aggregation, evaluation)."""

from __future__ import annotations

import json
import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.fleet_time import FLEET_CLIENTS, FLEET_SECONDS, FLEET_TOTAL
from fedapp.evaluation.operating_points import announce_points
from fedapp.evaluation.results import (
    BEST_MODEL_FILE,
    CHECKPOINT_FILE,
    FINAL_MODEL_FILE,
    RunRecorder,
    unreadable,
)
from fedapp.methods.common.strategy import HeterogeneousStrategy, State
from fedapp.run.exchange import PromptGrid
from fedapp.wire.messages import SELECTION_KEY, TRAIN_LOSS
from fedapp.wire.records import from_record, to_record

#: A round's heaviest clients (strategies send them first), pushed ahead of the rest so they
#: start first: a round cannot end before its heaviest client, and Flower's simulation engine
#: would otherwise start clients in node order, so that an actor idles while another finishes a
#: client that started last (measured in docs/performance.md, "Where the quickstart's time
#: goes"). Two: wherever a round is worth shortening, its clients run on at least two actors or
#: devices. The order changes no result: replies are aggregated in partition order.
LEADING_CLIENTS = 2


class RoundEngine:
    """One run's rounds for ``strategy``, in ``run_dir``: afresh, or (``resume``) after the
    folder's checkpoint, with the strategy's accounts (communication, compute, metering, method
    records) restored so that the summary covers the whole run."""

    def __init__(self, strategy: HeterogeneousStrategy, run_dir: Path, resume: bool) -> None:
        self.strategy = strategy
        self.run_dir = run_dir
        self.first_round, self.state, self.best, earlier = self._starting_point(resume)
        #: Seconds of setup and of the whole run before this start (0 unless resumed).
        self.earlier_setup, self.earlier_elapsed = earlier["setup"], earlier["elapsed"]
        strategy.rounds_done = self.first_round - 1

    def _starting_point(self, resume: bool) -> tuple[int, State, dict[str, Any], dict[str, float]]:
        """Round 1 from the initial state, or the round after the checkpoint; also the best
        round so far and the setup and elapsed seconds of the run before this start."""
        nothing_earlier = {"setup": 0.0, "elapsed": 0.0}
        fresh = (1, self.strategy.initial_state(), {"round": 0, SELECTION_KEY: -1.0})
        if not resume:
            return (*fresh, nothing_earlier)
        run_dir = self.run_dir
        try:
            done, state, extra = RunRecorder.load_checkpoint(run_dir)
        except FileNotFoundError:
            log(
                WARNING,
                "fedapp: resume = true but %s has no checkpoint; starting at round 1",
                run_dir,
            )
            return (*fresh, nothing_earlier)
        log(INFO, "fedapp: resuming %s after round %d", run_dir, done)
        if (run_dir / BEST_MODEL_FILE).exists():  # the final test reads it: a torn one fails now
            RunRecorder.load_state(run_dir / BEST_MODEL_FILE)
        try:
            earlier = {"setup": float(extra["setup"]), "elapsed": float(extra["elapsed"])}
            best = dict(extra["best"])
            self.strategy.restore_accounts(json.loads(extra["accounts"]))
        except (KeyError, TypeError, ValueError) as err:
            raise unreadable(
                run_dir / CHECKPOINT_FILE, f"not a checkpoint fedapp wrote: {err!r}"
            ) from None
        return done + 1, state, best, earlier

    def run_rounds(
        self,
        grid: Grid,
        recorder: RunRecorder,
        validation: ImageArrays,
        started: float,
        setup_seconds: float,
    ) -> None:
        """The rounds left, each ended by :class:`RoundEnd` (``started``: the run's clock)."""
        rounds = self.strategy.run.rounds
        round_end = RoundEnd(
            self.strategy, recorder, validation, self.state, self.best, started, setup_seconds
        )
        self.strategy.start(
            grid=PromptGrid(grid, lead=LEADING_CLIENTS),
            initial_arrays=to_record(self.state),
            num_rounds=rounds.num_server_rounds - self.strategy.rounds_done,
            timeout=rounds.round_timeout,
            evaluate_fn=round_end,
        )
        self.state, self.best = round_end.state, round_end.best

    def final_test(self, recorder: RunRecorder, test: ImageArrays) -> dict[str, Any]:
        """Keep the final state, then test the best validated one (the method's report and the
        run's accounts)."""
        recorder.save_state(FINAL_MODEL_FILE, self.state)
        best_state = RunRecorder.load_state(self.run_dir / BEST_MODEL_FILE)
        with announce_points("final test"):
            report = self.strategy.evaluator.test_summary(best_state, test, self.run_dir)
        accounts = self.strategy.accounting.summary(
            self.run_dir, self.strategy.params_by_client(best_state)
        )
        return report | accounts


def _plain(value: Any) -> Any:
    """numpy scalars and arrays in a method's records as JSON values."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint")


class RoundEnd:
    """What the run does after each of ``Strategy.start``'s rounds (its ``evaluate_fn``): the
    round's row of metrics.jsonl, validation every ``eval-every`` rounds and after the last
    (keeping the best state), the checkpoint a resumed run continues from, and the progress
    line."""

    def __init__(
        self,
        strategy: HeterogeneousStrategy,
        recorder: RunRecorder,
        validation: ImageArrays,
        state: State,
        best: dict[str, Any],
        started: float,
        setup_seconds: float,
    ) -> None:
        self.strategy = strategy
        self.rounds = strategy.run.rounds
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
        row[FLEET_TOTAL] = row[FLEET_SECONDS] + sum(
            float(r.get(FLEET_SECONDS, 0.0)) for r in self.recorder.rows
        )
        validation: dict[str, float] = {}
        last = self.rounds.num_server_rounds
        if server_round % self.rounds.eval_every == 0 or server_round == last:
            evaluation_start = time.perf_counter()
            validation = self.strategy.evaluator.validation_metrics(self.state, self.validation)
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
        _log_progress(last, row)
        return MetricRecord(validation) if validation else None


def _round_row(strategy: HeterogeneousStrategy, server_round: int) -> dict[str, Any]:
    """What happened in a training round: its clients, its phases' seconds, its length on the
    fleet, its traffic and the clients' example-weighted metrics. The fleet's round is its
    client phase on the fleet's clock plus the server's own measured work (aggregation, and
    what a method's server computes there); on the wall clock (deployment) it is the round's
    measured train phase plus that work."""
    report = strategy.report
    row: dict[str, Any] = {
        "round": server_round,
        "clients-sampled": report.sampled,
        "clients-accepted": report.accepted,
        "clients-dropped": len(report.dropped),
        "clients-late": report.late,
        "clients-surplus": report.surplus,
        "seconds-train-phase": report.aggregate_started - report.started,
        "seconds-aggregate": report.aggregate_ended - report.aggregate_started,
        "seconds-client-training-sum": report.client_seconds,
        "seconds-client-training-max": report.client_seconds_max,
    }
    clients = report.fleet_client_seconds if strategy.fleet.virtual else row["seconds-train-phase"]
    row[FLEET_CLIENTS] = clients
    row[FLEET_SECONDS] = clients + row["seconds-aggregate"]
    row["bytes-down"], row["bytes-up"] = strategy.accounting.ledger.round_bytes(server_round)
    metrics = strategy.round_metrics
    if metrics is not None:
        row |= {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    return row


def _log_progress(num_server_rounds: int, row: dict[str, Any]) -> None:
    accuracy = f"{100 * row[SELECTION_KEY]:.2f}%" if SELECTION_KEY in row else "-"
    loss = f"{row[TRAIN_LOSS]:.4f}" if TRAIN_LOSS in row else "-"
    log(
        INFO,
        "round %d/%d | clients %d/%d | train loss %s | val acc %s | %.1f s",
        row["round"],
        num_server_rounds,
        row["clients-accepted"],
        row["clients-sampled"],
        loss,
        accuracy,
        row["seconds"],
    )
