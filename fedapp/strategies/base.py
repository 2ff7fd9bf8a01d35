"""Base of every fedapp server strategy: one message per node, seeded cohorts, checked replies.

A method only says what each node receives (``train_payload``, ``train_config``) and how valid
replies become the new global state (``aggregate``). The base handles the rest the same way for
all of them: late nodes are profiled when first seen, cohorts are drawn with a generator fixed by
(seed, round) over nodes ordered by partition id, every reply is checked against what was sent
and a bad one is dropped with a logged reason, failed or silent nodes are skipped.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedapp.config import RunConfig
from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.evaluation.accounting import CommunicationLedger, work_by_device
from fedapp.evaluation.intervals import with_interval
from fedapp.evaluation.operating_points import PointEvaluator
from fedapp.evaluation.results import write_csv
from fedapp.exchange import exchange
from fedapp.federated_data import server_set
from fedapp.messages import (
    ACCURACY,
    ARRAYS,
    COMPUTE_METRIC,
    CONFIG,
    CPU_PERCENT,
    EVAL_SPLIT,
    LEARNING_RATE,
    LOSS,
    NUM_EXAMPLES,
    PEAK_RSS_MB,
    SELECTION_KEY,
    SERVER_ROUND,
    TRAIN_SECONDS,
    WALL_SECONDS,
)
from fedapp.methods import strategy_class
from fedapp.partitions.cohorts import cohort_indices
from fedapp.profiles import NodeProfile, NodeRegistry
from fedapp.random_streams import Stream, stream_seed
from fedapp.records import from_record, to_record
from fedapp.strategies.reply_validation import (
    ArraySpec,
    InvalidReply,
    ValidReply,
    spec_of,
    validate_metrics,
    validate_reply,
)
from fedapp.training.loops import resolve_device

State = dict[str, np.ndarray]
COMMUNICATION_FILE = "communication.csv"  # one row per accepted client-round
CLIENT_WORK_FILE = "client_work.csv"  # one row per metered client-round: device, seconds, memory


@dataclass
class RoundReport:
    """What happened to the messages of one training round."""

    sampled: int = 0
    replied: int = 0
    accepted: int = 0
    client_seconds: float = 0.0  # sum of the accepted clients' own training time
    client_seconds_max: float = 0.0  # the longest of them: no round can be shorter
    dropped: dict[int, str] = field(default_factory=dict)  # node id -> reason


class HeterogeneousStrategy(Strategy):
    """Flower strategy whose payload, training config and aggregation may differ per node."""

    def __init__(self, cfg: RunConfig, nodes: NodeRegistry) -> None:
        self.cfg = cfg
        self.nodes = nodes
        self.report = RoundReport()
        self._expected: dict[int, dict[str, ArraySpec]] = {}
        self._global: State = {}
        #: Every accepted client-round's traffic (full_params is set from the first global state).
        self.ledger = CommunicationLedger(full_params=0)
        #: Training compute each partition reported (``COMPUTE_METRIC``), summed over rounds.
        self.compute_proxy: dict[int, float] = {}
        self._sent: dict[int, tuple[int, int]] = {}  # node id -> (params, bytes) of its payload
        self._grid: Grid | None = None  # kept for methods whose models live on the clients
        self._left_out: set[int] = set()  # nodes already logged as unable to take part
        #: Each accepted client-round's metered work (fedapp.clients.metering) and the device
        #: that did it, so a mixed federation's slow or memory-bound nodes can be told apart.
        self.client_work: list[dict[str, Any]] = []
        #: Operating points some accepted client trained directly (keys of ``points_trained``).
        self.trained_points: set[Hashable] = set()

    # ---- what a method defines -------------------------------------------------------------
    @abstractmethod
    def initial_state(self) -> State:
        """The global state before round 1 (seeded)."""

    @abstractmethod
    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        """The arrays one node receives; by default its reply must echo their names and shapes."""

    @abstractmethod
    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        """The new global state from the round's valid replies."""

    @abstractmethod
    def evaluate(self, state: State, data: ImageArrays) -> dict[str, float]:
        """Centralized evaluation of a global state: 'loss', 'accuracy', 'examples'."""

    def validation_metrics(self, state: State, data: ImageArrays) -> dict[str, float]:
        """Per-round validation; must include SELECTION_KEY (methods with many operating
        points report one entry per point and select on their mean)."""
        result = self.evaluate(state, data)
        return {"val-loss": result[LOSS], SELECTION_KEY: result[ACCURACY]}

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        """The one final test evaluation of the selected checkpoint, for summary.json (methods
        with more to report write their tables and plots into ``run_dir``)."""
        result = self.evaluate(state, data)
        return {
            "test_accuracy": result[ACCURACY],
            "test_loss": result[LOSS],
            "test_examples": result["examples"],
        } | self.accounting_summary(run_dir)

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        """Per-node training settings decided by the server (the rest comes from the run config)."""
        return {
            SERVER_ROUND: server_round,
            LEARNING_RATE: scheduled_learning_rate(self.cfg, server_round),
        }

    def ineligibility(self, profile: NodeProfile) -> str | None:
        """Why a node cannot take part at all (e.g. its budget affords no model), or None."""
        return None

    def eligible(self, profile: NodeProfile) -> bool:
        """Whether a node can take part; one that cannot is logged once with the reason."""
        reason = self.ineligibility(profile)
        if reason is not None and profile.node_id not in self._left_out:
            self._left_out.add(profile.node_id)
            log(
                ERROR,
                "%s: node %s (partition %d) left out: %s",
                self.cfg.strategy,
                profile.node_id,
                profile.partition_id,
                reason,
            )
        return reason is None

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        """What a valid reply must contain (default: the payload's names, shapes and dtypes)."""
        return spec_of(payload)

    def reference_params(self, global_state: State) -> int:
        """The parameter count that communication reductions are measured against (default:
        the whole global state, i.e. what FedAvg would send)."""
        return float_elements(global_state)

    def payload_params(self, profile: NodeProfile, payload: State) -> int:
        """Parameters a node's payload carries, for the communication ledger."""
        return float_elements(payload)

    def points_trained(self, profile: NodeProfile) -> Iterable[Hashable]:
        """The operating points a node trained directly this round (called for each accepted
        reply, before ``aggregate``); methods with operating points mark them ``trained``."""
        return ()

    def expected_work(self, node_id: int) -> float:
        """A node's training work this round, relative to the cohort's: its examples times the
        parameters it was sent (which grow with the model it trains)."""
        return self.nodes.profiles[node_id].num_examples * self._sent[node_id][0]

    # ---- accounting --------------------------------------------------------------------------
    def _account(self, server_round: int, reply: ValidReply) -> None:
        profile = self.nodes.profiles[reply.node_id]
        params, bytes_down = self._sent[reply.node_id]
        bytes_up = sum(a.nbytes for a in reply.arrays.values())
        self.ledger.add(server_round, profile.partition_id, params, bytes_down, bytes_up)
        if {CPU_PERCENT, PEAK_RSS_MB, WALL_SECONDS} <= set(reply.metrics):
            self.client_work.append(
                {
                    "round": server_round,
                    "partition": profile.partition_id,
                    "device": profile.device,
                    "seconds": float(reply.metrics[WALL_SECONDS]),
                    "cpu_percent": float(reply.metrics[CPU_PERCENT]),
                    "peak_rss_mb": float(reply.metrics[PEAK_RSS_MB]),
                }
            )
        if COMPUTE_METRIC in reply.metrics:
            self.compute_proxy[profile.partition_id] = self.compute_proxy.get(
                profile.partition_id, 0.0
            ) + float(reply.metrics[COMPUTE_METRIC])

    def accounts(self) -> dict[str, Any]:
        """Everything the run has accumulated besides the global state that summary.json reports
        (or that decides later rounds), for the checkpoint: a resumed run continues from it.
        Methods with more such records extend this and :meth:`restore_accounts`."""
        return {
            "ledger_full_params": self.ledger.full_params,
            "ledger_rows": [dict(row) for row in self.ledger.client_rounds],
            "compute_proxy": dict(self.compute_proxy),
            "client_work": [dict(row) for row in self.client_work],
            "trained_points": sorted(self.trained_points),
        }

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        """Continue from :meth:`accounts` of a checkpoint."""
        self.ledger = CommunicationLedger(
            full_params=int(accounts["ledger_full_params"]),
            client_rounds=[dict(row) for row in accounts["ledger_rows"]],
        )
        self.compute_proxy = {int(k): float(v) for k, v in accounts["compute_proxy"].items()}
        self.client_work = [dict(row) for row in accounts.get("client_work", [])] or [
            {"cpu_percent": cpu, "peak_rss_mb": rss}  # a checkpoint from before client_work.csv
            for cpu, rss in accounts.get("resource_use", [])
        ]
        self.trained_points = set(accounts["trained_points"])

    def accounting_summary(
        self, run_dir: Path, params_by_client: dict[int, int] | None = None
    ) -> dict[str, Any]:
        """Communication and compute of the run so far, for summary.json (and its CSV)."""
        if self.ledger.client_rounds:
            write_csv(run_dir / COMMUNICATION_FILE, self.ledger.client_rounds)
        if self.client_work:
            write_csv(run_dir / CLIENT_WORK_FILE, self.client_work)
        use = np.array([[r["cpu_percent"], r["peak_rss_mb"]] for r in self.client_work])
        use = use.reshape(-1, 2)
        comm = self.ledger.summary(params_by_client)
        clients = max(len({row["partition"] for row in self.ledger.client_rounds}), 1)
        traffic_mb = (comm.get("bytes_down_total", 0.0) + comm.get("bytes_up_total", 0.0)) / 2**20
        return {
            "resources": {
                "cpu_percent_mean": float(use[:, 0].mean()) if len(use) else None,
                "peak_rss_mb_mean": float(use[:, 1].mean()) if len(use) else None,
                "peak_rss_mb_max": float(use[:, 1].max()) if len(use) else None,
                "metered_client_rounds": len(use),
                "comm_mb_per_client": traffic_mb / clients,
                "comm_mb_total": traffic_mb,
            },
            "work_by_device": work_by_device(self.client_work),
            "comm": comm,
            "compute_proxy_total_macs": float(sum(self.compute_proxy.values())),
            "compute_proxy_by_client": {str(k): v for k, v in sorted(self.compute_proxy.items())},
        }

    # ---- cohort ------------------------------------------------------------------------------
    def sample_cohort(self, server_round: int, grid: Grid) -> list[NodeProfile]:
        """Seeded draw of this round's clients among the connected, profiled nodes."""
        connected = list(grid.get_node_ids())
        self.nodes.discover(grid, connected, self.cfg.round_timeout)
        candidates = sorted(
            (
                self.nodes.profiles[n]
                for n in connected
                if n in self.nodes.profiles and self.eligible(self.nodes.profiles[n])
            ),
            key=lambda p: p.partition_id,
        )
        size = min(self.cfg.cohort_size, len(candidates))
        if size < self.cfg.cohort_size:
            log(
                WARNING,
                "round %d: only %d nodes available for a cohort of %d",
                server_round,
                size,
                self.cfg.cohort_size,
            )
        chosen = cohort_indices(
            self.cfg.cohort_rng, self.cfg.seed, server_round, len(candidates), size
        )
        return [candidates[i] for i in chosen]

    # ---- one round on numpy states (the ServerApp's loop calls these directly) ---------------
    def configure_round(
        self, server_round: int, state: State, grid: Grid, config: ConfigRecord | None = None
    ) -> list[Message]:
        """One TRAIN message per sampled node, each with its own payload and settings."""
        self._global = state
        self._grid = grid
        if not self.ledger.full_params:
            self.ledger.full_params = self.reference_params(state)
        config = config or ConfigRecord()
        self._expected = {}
        self._sent = {}
        messages = []
        for profile in self.sample_cohort(server_round, grid):
            payload = self.train_payload(profile, self._global)
            self._expected[profile.node_id] = self.expected_reply(profile, payload)
            self._sent[profile.node_id] = (
                self.payload_params(profile, payload),
                sum(a.nbytes for a in payload.values()),
            )
            node_config = ConfigRecord({**config, **self.train_config(server_round, profile)})
            content = RecordDict({ARRAYS: to_record(payload), CONFIG: node_config})
            messages.append(
                Message(
                    content,
                    dst_node_id=profile.node_id,
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                )
            )
        self.report = RoundReport(sampled=len(messages))
        return messages

    def aggregate_round(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[State | None, dict[str, float | int] | None]:
        """New global state and example-weighted metrics from the valid replies (None, None
        when no reply is valid: the global state stays as it was)."""
        valid: list[ValidReply] = []
        for message in replies:
            node_id = message.metadata.src_node_id
            self.report.replied += 1
            try:
                if node_id not in self._expected:
                    raise InvalidReply("node was not sampled this round")
                valid.append(validate_reply(message, self._expected.pop(node_id)))
            except InvalidReply as err:
                self.report.dropped[node_id] = str(err)
                profile = self.nodes.profiles.get(node_id)
                log(
                    WARNING,
                    "round %d: dropped reply of node %s (partition %s): %s",
                    server_round,
                    node_id,
                    profile.partition_id if profile else "?",
                    err,
                )
        for node_id in self._expected:
            self.report.dropped[node_id] = "no reply (round timeout, or the node left)"
        self.report.accepted = len(valid)
        seconds = [float(r.metrics.get(TRAIN_SECONDS, 0.0)) for r in valid]
        self.report.client_seconds = float(sum(seconds))
        self.report.client_seconds_max = max(seconds, default=0.0)
        if not valid:
            log(WARNING, "round %d: no valid reply; the global state is unchanged", server_round)
            return None, None
        # Replies arrive in any order; float sums depend on it, so aggregate in partition order.
        valid.sort(key=lambda r: self.nodes.profiles[r.node_id].partition_id)
        for reply in valid:
            self._account(server_round, reply)
            self.trained_points.update(self.points_trained(self.nodes.profiles[reply.node_id]))
        return self.aggregate(server_round, valid, self._global), weighted_metrics(valid)

    # ---- evaluation of models that live on the clients ---------------------------------------
    def client_evaluation(self, split: str) -> list[dict[str, float | int]]:
        """Every profiled node evaluates its own model on a server-held split ('validation' or
        'test', which clients derive from the run config); one metrics dict per valid reply, in
        partition order, with 'partition' and the accuracy's 95 % interval (from the node's own
        num-examples: ci95_low, ci95_high) added. For methods without a global model."""
        if self._grid is None:
            raise RuntimeError("client evaluation needs a grid: run a training round first")
        connected = set(self._grid.get_node_ids())
        messages = [
            Message(
                RecordDict({CONFIG: ConfigRecord({EVAL_SPLIT: split})}),
                dst_node_id=node_id,
                message_type=MessageType.EVALUATE,
            )
            for node_id in sorted(connected & set(self.nodes.profiles))
        ]
        rows = []
        for reply in exchange(self._grid, messages, self.cfg.round_timeout):
            profile = self.nodes.profiles[reply.metadata.src_node_id]
            try:  # an accuracy outside [0, 1] is refused with the reply, by with_interval
                metrics = with_interval(validate_metrics(reply))
            except ValueError as err:  # InvalidReply is one
                log(WARNING, "%s evaluation: dropped node %s: %s", split, profile.node_id, err)
                continue
            rows.append({"partition": profile.partition_id, **metrics})
        return sorted(rows, key=lambda row: row["partition"])

    def client_mean(self, split: str) -> tuple[dict[str, float], list[dict[str, float | int]]]:
        """Unweighted mean accuracy and loss over the clients' own models on a split (NaN when
        no client answered validly), and the per-client rows of :meth:`client_evaluation`."""
        rows = self.client_evaluation(split)
        mean = {
            key: float(np.mean([r[key] for r in rows])) if rows else float("nan")
            for key in (ACCURACY, LOSS)
        }
        return mean, rows

    # ---- Flower's Strategy interface (records in and out; e.g. for Strategy.start) ----------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.configure_round(server_round, from_record(arrays), grid, config)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        state, metrics = self.aggregate_round(server_round, replies)
        if state is None:
            return None, None
        return to_record(state), MetricRecord(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluation is centralized on server-held data; no client evaluation round."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        log(INFO, "\t├── strategy: %s", type(self).__name__)
        log(INFO, "\t├── clients: %d, per round: %d", self.cfg.num_clients, self.cfg.cohort_size)
        log(INFO, "\t└── rounds: %d, seed: %d", self.cfg.num_server_rounds, self.cfg.seed)


def point_evaluator(cfg: RunConfig, info: DatasetInfo) -> PointEvaluator:
    """The run's evaluation of operating points: its calibration split, batch size, device and
    seed, the same for every weight-shared method."""
    return PointEvaluator(
        server_set(cfg, "calibration"),
        info,
        cfg.batch_size,
        resolve_device(cfg.device),
        stream_seed(cfg.seed, Stream.BN_RECALIBRATION),
    )


def scheduled_learning_rate(cfg: RunConfig, server_round: int) -> float:
    """The round's learning rate: constant, or cosine decay over the round horizon."""
    if cfg.lr_schedule == "cosine":
        progress = (server_round - 1) / cfg.num_server_rounds
        return 0.5 * cfg.learning_rate * (1 + math.cos(math.pi * progress))
    return cfg.learning_rate


def float_elements(state: State) -> int:
    """Number of floating-point values in a state (parameters and BN statistics)."""
    return int(sum(a.size for a in state.values() if np.issubdtype(a.dtype, np.floating)))


def weighted_metrics(replies: list[ValidReply]) -> dict[str, float | int]:
    """Example-weighted mean of every scalar metric the replies share; examples are summed."""
    total = sum(r.num_examples for r in replies)
    shared = set.intersection(*(set(r.metrics) for r in replies)) - {NUM_EXAMPLES}
    out: dict[str, float | int] = {NUM_EXAMPLES: total}
    for key in sorted(shared):
        if all(isinstance(r.metrics[key], int | float) for r in replies):
            out[key] = sum(float(r.metrics[key]) * r.num_examples for r in replies) / total
    return out


def build_strategy(cfg: RunConfig, nodes: NodeRegistry) -> HeterogeneousStrategy:
    """The server strategy the run config selects (fedapp.methods names it)."""
    return strategy_class(cfg.strategy)(cfg, nodes)
