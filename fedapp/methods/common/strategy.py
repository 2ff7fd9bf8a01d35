"""Base of every fedapp server strategy: a Flower ``Strategy`` whose messages differ per node.

A method only says what each node receives (``train_payload``, ``train_config``), how valid replies
become the new global state (``aggregate``) and how it is measured (``evaluator``). Flower's hooks
(``configure_train``, ``aggregate_train``) compose the rest the same way for all of them, so
``Strategy.start`` runs any method: a seeded cohort (``CohortSampler``), one message per node, every
reply checked against what was sent and what the server knows of its node (``check_round``: a bad
one is dropped with a logged reason), the valid ones timed on the run's fleet and kept as its
round policy says (``RunFleet``: a late or surplus one is dropped and counted), each node's
share of the round's weight capped where ``max-weight-share`` says so, an aggregate that is not
finite refused, and each accepted client-round recorded once in the run's accounts
(``RunAccounts``).
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedapp.evaluation.accounting import RunAccounts
from fedapp.evaluation.operating_points import OperatingPoint, PointEvaluator
from fedapp.method_table import strategy_class
from fedapp.methods.common.cohort import CohortSampler
from fedapp.methods.common.evaluators import Evaluator, State
from fedapp.methods.common.reply_validation import (
    ArraySpec,
    ComputeFloor,
    ReplySchema,
    ValidReply,
    cap_shares,
    check_round,
    spec_of,
)
from fedapp.random_streams import Stream, stream_seed
from fedapp.run.config import RunConfig
from fedapp.run.context import RunContext, run_context
from fedapp.run.federated_data import server_set
from fedapp.run.fleet import RunFleet
from fedapp.run.pieces import RoundPlan
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.training.loops import resolve_device
from fedapp.training.train_metrics import FORWARD_BACKWARD_FACTOR
from fedapp.wire.messages import (
    ARRAYS,
    COMPUTE_METRIC,
    CONFIG,
    DATA_FACTS,
    LEARNING_RATE,
    NUM_EXAMPLES,
    SERVER_ROUND,
    TRAIN_SECONDS,
)
from fedapp.wire.records import from_record, to_record


class NotServable(ValueError):
    """The method's models cannot be served from the server's state (they live on the clients)."""


@dataclass
class RoundReport:
    """What happened to the messages of one training round, and when (``time.perf_counter``)."""

    sampled: int = 0
    accepted: int = 0
    client_seconds: float = 0.0  # sum of the accepted clients' own training time
    client_seconds_max: float = 0.0  # the longest of them: no round can be shorter
    dropped: dict[int, str] = field(default_factory=dict)  # node id -> reason
    late: int = 0  # valid replies dropped past the fleet's deadline
    surplus: int = 0  # valid replies dropped beyond an over-committed cohort
    fleet_client_seconds: float = 0.0  # the client phase on the fleet's clock (virtual)
    started: float = 0.0  # the round's configuration began
    aggregate_started: float = 0.0  # the replies were in
    aggregate_ended: float = 0.0


class HeterogeneousStrategy(Strategy):
    """Flower strategy whose payload, training config and aggregation may differ per node."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        #: What the run shares: the rounds' plan, data layout, model spaces, local training and
        #: the method's own settings.
        self.run = run
        self.nodes = nodes
        #: The run's data-set facts (channels, image size, classes) and the device it runs on.
        self.info = self.run.info
        self.device = resolve_device(run.training.device)
        self.report = RoundReport()
        #: The fleet the rounds are timed on: each client's device class and reachability.
        self.fleet = RunFleet(run.fleet, run.data.budgets, run.rounds.seed)
        self.cohorts = CohortSampler(
            run.strategy, run.rounds, nodes, self.fleet, self.ineligibility
        )
        #: The run's accounts: traffic, compute, metered work, trained operating points.
        self.accounting = RunAccounts()
        #: Rounds a resumed run finished before this start: ``Strategy.start`` counts its
        #: rounds from 1, the run's round numbers (cohorts, schedules, rows) go on from here.
        self.rounds_done = 0
        #: The last training round's example-weighted client metrics (None: no valid reply).
        self.round_metrics: dict[str, float | int] | None = None
        self._expected: dict[int, ReplySchema] = {}
        self._global: State = {}
        self._sent: dict[int, tuple[int, int]] = {}  # node id -> (params, bytes) of its payload
        self._grid: Grid | None = None  # kept for methods whose models live on the clients

    #: How the method is measured: one of fedapp.methods.common.evaluators' kinds, set by the
    #: method's constructor.
    evaluator: Evaluator

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

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        """Per-node training settings decided by the server (the rest comes from the run config)."""
        return {
            SERVER_ROUND: server_round,
            LEARNING_RATE: scheduled_learning_rate(self.run.rounds, server_round),
        }

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """The models the method serves from a global state, smallest first: what its final
        test measures and what ``fedapp export`` writes. A method that serves models from its
        state overrides this."""
        raise NotServable(
            f"strategy {self.run.strategy!r} does not say which models its state serves"
        )

    def ineligibility(self, profile: NodeProfile) -> str | None:
        """Why a node cannot take part at all (e.g. its budget affords no model), or None."""
        return None

    def eligible(self, profile: NodeProfile) -> bool:
        """Whether a node can take part; one that cannot is logged once with the reason."""
        return self.cohorts.eligible(profile)

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        """What a valid reply must contain (default: the payload's names, shapes and dtypes)."""
        return spec_of(payload)

    #: The scalar metrics a method reads from every training reply besides num-examples.
    reply_metrics: frozenset[str] = frozenset()

    def read_reply(self, reply: ValidReply) -> None:
        """A method's own reading of a reply that passed the common checks (e.g. the NAS
        choice it names); whatever it raises drops the reply with the reason logged."""

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """The least compute proxy a node's training reply this round can report (asked once
        its payload is made): a method that knows what its clients train bounds it, so that no
        client shortens its time on the fleet's clock by under-reporting; the default bounds
        nothing."""
        return ComputeFloor()

    def training_floor(self, forward_macs: float, epochs: int | None = None) -> ComputeFloor:
        """The floor of ``epochs`` (default: ``local-epochs``) over the shard, each example
        costing at least ``forward_macs`` forward MACs and the backward pass after them."""
        epochs = self.run.training.local_epochs if epochs is None else epochs
        return ComputeFloor(FORWARD_BACKWARD_FACTOR * forward_macs * epochs)

    #: Whether a client trains its whole shard (its profile's examples), so that its compute
    #: floor counts them whatever its reply claims (FedKD-NAS holds part of it out).
    trains_whole_shard: bool = True

    def reply_schema(self, profile: NodeProfile, payload: State) -> ReplySchema:
        """What a node's training reply must hold: ``expected_reply``'s arrays, the method's
        ``reply_metrics``, no more examples than the node's profile holds, and at least the
        compute its examples take."""
        floor = self.compute_floor(profile)
        if self.trains_whole_shard:
            floor = replace(floor, held=profile.num_examples)
        return ReplySchema(
            arrays=self.expected_reply(profile, payload),
            metrics=self.reply_metrics,
            max_examples=profile.num_examples,
            compute_floor=floor,
            read=self.read_reply,
        )

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

    def params_by_client(self, state: State) -> dict[int, int] | None:
        """What each partition would be sent of ``state``, for the communication summary
        (default: the mean of what it was sent in the rounds it took part in)."""
        return None

    def communication(self, state: State) -> dict[str, float]:
        """The run's communication so far, as summary.json's 'comm' reports it."""
        return self.accounting.ledger.summary(self.params_by_client(state))

    # ---- what a resumed run continues from ----------------------------------------------------
    def accounts(self) -> dict[str, Any]:
        """Everything the run has accumulated besides the global state that summary.json reports
        (or that decides later rounds), for the checkpoint: a resumed run continues from it.
        Methods with more such records extend this and :meth:`restore_accounts`."""
        return self.accounting.to_checkpoint()

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        """Continue from :meth:`accounts` of a checkpoint."""
        self.accounting = RunAccounts.from_checkpoint(accounts)

    # ---- cohort ------------------------------------------------------------------------------
    def sample_cohort(self, server_round: int, grid: Grid) -> list[NodeProfile]:
        """Seeded draw of this round's clients among the connected, profiled nodes."""
        return self.cohorts.sample(server_round, grid)

    # ---- one round on numpy states (what Flower's hooks below convert records for) ----------
    def configure_round(
        self, server_round: int, state: State, grid: Grid, config: ConfigRecord | None = None
    ) -> list[Message]:
        """One TRAIN message per sampled node, each with its own payload and settings."""
        started = time.perf_counter()
        self._global = state
        self._grid = grid
        if not self.accounting.ledger.full_params:
            self.accounting.ledger.full_params = self.reference_params(state)
        config = config or ConfigRecord()
        self._expected = {}
        self._sent = {}
        messages = []
        for profile in self.sample_cohort(server_round, grid):
            payload = self.train_payload(profile, self._global)
            self._expected[profile.node_id] = self.reply_schema(profile, payload)
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
        self.report = RoundReport(sampled=len(messages), started=started)
        return messages

    def aggregate_round(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[State | None, dict[str, float | int] | None]:
        """New global state and example-weighted metrics from the valid replies (None, None
        when no reply is valid; None for a state that is not finite: the global state then
        stays as it was)."""
        self.report.aggregate_started = time.perf_counter()
        checked = check_round(server_round, replies, self._expected, self._partition_of)
        on_time, lost = self.clock_round(server_round, checked.valid)
        valid = cap_shares(on_time, self.run.rounds.max_weight_share)
        self.report.dropped = checked.dropped | lost
        self.report.accepted = len(valid)
        seconds = [float(r.metrics.get(TRAIN_SECONDS, 0.0)) for r in valid]
        self.report.client_seconds = float(sum(seconds))
        self.report.client_seconds_max = max(seconds, default=0.0)
        if not valid:
            log(WARNING, "round %d: no valid reply; the global state is unchanged", server_round)
            return None, None
        for reply in valid:
            profile = self.nodes.profiles[reply.node_id]
            self.accounting.record(
                server_round,
                profile.partition_id,
                profile.device,
                self._sent[reply.node_id],
                reply_bytes(reply),
                reply.metrics,
            )
            self.accounting.trained_points.update(self.points_trained(profile))
        state = self.aggregate(server_round, valid, self._global)
        return finite_or_none(server_round, state), weighted_metrics(valid)

    def clock_round(
        self, server_round: int, replies: list[ValidReply]
    ) -> tuple[list[ValidReply], dict[int, str]]:
        """The valid replies the round's policy keeps, in their order, and why the others are
        dropped; each client-round's fleet seconds (its payload down, the compute proxy it
        reported, its reply up) go to the accounts. On the wall clock every reply is kept."""
        if not self.fleet.virtual or not replies:
            return replies, {}
        partition = {r.node_id: self.nodes.profiles[r.node_id].partition_id for r in replies}
        seconds = {
            r.node_id: self.fleet.client_seconds(
                partition[r.node_id],
                self._sent[r.node_id][1],
                float(r.metrics.get(COMPUTE_METRIC, 0.0)),
                reply_bytes(r),
            )
            for r in replies
        }
        timing = self.fleet.time_round(seconds, self.run.rounds.cohort_size)
        self.report.fleet_client_seconds = timing.seconds
        self.report.late, self.report.surplus = len(timing.late), len(timing.surplus)
        deadline = self.run.fleet.deadline
        lost = {
            n: f"late: {seconds[n]:.2f} fleet seconds, past the {deadline:g} s deadline"
            for n in timing.late
        } | {
            n: f"surplus: in after the first {len(timing.kept)} of an over-committed cohort"
            for n in timing.surplus
        }
        for node in sorted(seconds, key=lambda n: partition[n]):
            outcome = (
                "late" if node in timing.late else "surplus" if node in timing.surplus else "kept"
            )
            self.accounting.record_fleet(
                server_round,
                partition[node],
                self.fleet.device(partition[node]).name,
                seconds[node],
                outcome,
            )
        if lost:
            log(
                INFO,
                "round %d: the fleet's %s policy drops %d of %d replies (%d late, %d surplus)",
                server_round,
                self.run.fleet.policy,
                len(lost),
                len(replies),
                len(timing.late),
                len(timing.surplus),
            )
        kept = set(timing.kept)
        return [r for r in replies if r.node_id in kept], lost

    def _partition_of(self, node_id: int) -> int | None:
        profile = self.nodes.profiles.get(node_id)
        return None if profile is None else profile.partition_id

    # ---- Flower's Strategy hooks: what Strategy.start calls ------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The round's messages, heaviest work first (a round cannot end before its heaviest
        client; a grid that starts the first ones earlier shortens it), each with the data
        set's facts when the nodes' registry has them (a node then need not load the set)."""
        messages = self.configure_round(
            server_round + self.rounds_done, from_record(arrays), grid, config
        )
        if self.nodes.data_facts:
            for message in messages:
                message.content[DATA_FACTS] = ConfigRecord(self.nodes.data_facts)
        messages.sort(key=lambda m: -self.expected_work(m.metadata.dst_node_id))
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        state, self.round_metrics = self.aggregate_round(server_round + self.rounds_done, replies)
        self.report.aggregate_ended = time.perf_counter()
        metrics = None if self.round_metrics is None else MetricRecord(self.round_metrics)
        return (None if state is None else to_record(state)), metrics

    def last_grid(self) -> Grid | None:
        """The grid of the last training round (None before the first): models that live on
        the clients are evaluated through it."""
        return self._grid

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation round: the ``evaluator`` measures the method on the cadence
        of the ``evaluate_fn`` given to ``Strategy.start`` (client-held models through
        :meth:`last_grid`)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        log(INFO, "\t├── strategy: %s", type(self).__name__)
        log(
            INFO,
            "\t├── clients: %d, per round: %d",
            self.run.rounds.num_clients,
            self.run.rounds.cohort_size,
        )
        log(
            INFO,
            "\t└── rounds: %d, seed: %d",
            self.run.rounds.num_server_rounds,
            self.run.rounds.seed,
        )


def point_evaluator(run: RunContext) -> PointEvaluator:
    """The run's evaluation of operating points: its calibration split, batch size, device and
    seed, the same for every weight-shared method."""
    return PointEvaluator(
        server_set(run.data, "calibration"),
        run.info,
        run.training.batch_size,
        resolve_device(run.training.device),
        stream_seed(run.training.seed, Stream.BN_RECALIBRATION),
    )


def scheduled_learning_rate(rounds: RoundPlan, server_round: int) -> float:
    """The round's learning rate: constant, or cosine decay over the round horizon."""
    if rounds.lr_schedule == "cosine":
        progress = (server_round - 1) / rounds.num_server_rounds
        return 0.5 * rounds.learning_rate * (1 + math.cos(math.pi * progress))
    return rounds.learning_rate


def reply_bytes(reply: ValidReply) -> int:
    """Bytes of a reply's arrays: what its node uploaded."""
    return int(sum(a.nbytes for a in reply.arrays.values()))


def float_elements(state: State) -> int:
    """Number of floating-point values in a state (parameters and BN statistics)."""
    return int(sum(a.size for a in state.values() if np.issubdtype(a.dtype, np.floating)))


def weighted_metrics(replies: list[ValidReply]) -> dict[str, float | int]:
    """Example-weighted mean (by each reply's ``weight``) of every scalar metric the replies
    share; examples are summed."""
    total = sum(r.weight for r in replies)
    shared = set.intersection(*(set(r.metrics) for r in replies)) - {NUM_EXAMPLES}
    out: dict[str, float | int] = {NUM_EXAMPLES: sum(r.num_examples for r in replies)}
    for key in sorted(shared):
        if all(isinstance(r.metrics[key], int | float) for r in replies):
            out[key] = sum(float(r.metrics[key]) * r.weight for r in replies) / total
    return out


def finite_or_none(server_round: int, state: State) -> State | None:
    """The aggregated state, or None (the round keeps the previous one, and says so) where
    one of its floating-point values is not finite: a checkpoint never holds inf or NaN."""
    broken = [
        name
        for name, array in state.items()
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all()
    ]
    if not broken:
        return state
    log(
        WARNING,
        "round %d: the aggregated state is not finite (%s); refused, the previous state is kept",
        server_round,
        ", ".join(broken[:3]),
    )
    return None


def build_strategy(cfg: RunConfig, nodes: NodeRegistry) -> HeterogeneousStrategy:
    """The server strategy the run config selects (fedapp.methods names it)."""
    return strategy_class(cfg.strategy)(run_context(cfg), nodes)
