"""The one model a logit-exchange client owns (FedMD, FedDistill): chosen, kept, evaluated.

These methods exchange predictions, never weights, so each client's model lives only on the
client: it is the largest candidate of the run's family (``nas-family``) that the client's budget
affords, built once, and kept across rounds in the node's Flower state. The server asks for its
accuracy through EVALUATE messages (``HeterogeneousStrategy.client_evaluation``).
"""

from __future__ import annotations

from flwr.app import Message, MetricRecord, RecordDict
from torch import nn

from fedapp.clients.local_state import load_arrays, save_arrays
from fedapp.clients.training import eval_loader, evaluate, resolve_device
from fedapp.config import RunConfig
from fedapp.data.registry import DatasetInfo
from fedapp.evaluation.operating_points import EVAL_BATCH_SIZE
from fedapp.federated_data import population, server_set
from fedapp.messages import CONFIG, EVAL_SPLIT, METRICS, NUM_EXAMPLES, load_state
from fedapp.models.families import (
    Candidate,
    build_candidate,
    family_candidates,
    largest_affordable,
    run_family,
)
from fedapp.profiles import LocalNode

MODEL_KEY = "kept-model"  # node-state key of the client's own model


def run_candidates(cfg: RunConfig, info: DatasetInfo) -> list[Candidate]:
    """The run's family, cheapest first (the server uses it to tell who can take part)."""
    return family_candidates(run_family(cfg), info, cfg.batch_size)


def own_candidate(cfg: RunConfig, info: DatasetInfo, budget: float) -> Candidate:
    """The largest candidate the budget affords; BudgetError when none does."""
    return largest_affordable(run_candidates(cfg, info), budget)


def kept_model(cfg: RunConfig, node: LocalNode, info: DatasetInfo) -> tuple[nn.Module, bool]:
    """(this node's model, whether it is new): the kept weights if any, else a fresh build."""
    model = build_candidate(own_candidate(cfg, info, node.budget).name, info)
    saved = load_arrays(node.state, MODEL_KEY)
    if saved is not None:
        load_state(model, saved)
    return model, saved is None


def keep_model(node: LocalNode, model: nn.Module) -> None:
    """Store the model in the node's state for its next message."""
    save_arrays(node.state, MODEL_KEY, model.state_dict())


def evaluate_kept_model(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    """Client evaluator: this node's kept model on the server-held split the message names.

    A node that has not trained yet has no model: it answers zero examples, which the server
    drops (with a logged reason) instead of averaging in an untrained model.
    """
    if load_arrays(node.state, MODEL_KEY) is None:
        return RecordDict({METRICS: MetricRecord({NUM_EXAMPLES: 0})})
    info = population(cfg).info
    model, _ = kept_model(cfg, node, info)
    return evaluation_reply(model, own_candidate(cfg, info, node.budget), message, cfg, info)


def evaluation_reply(
    model: nn.Module, candidate: Candidate, message: Message, cfg: RunConfig, info: DatasetInfo
) -> RecordDict:
    """A client-held candidate's accuracy and loss on the split an EVALUATE message names, with
    its costs (what every client evaluator of a family model answers)."""
    data = server_set(cfg, str(message.content[CONFIG][EVAL_SPLIT]))
    result = evaluate(model, eval_loader(data, info, EVAL_BATCH_SIZE), resolve_device(cfg.device))
    metrics = {
        NUM_EXAMPLES: int(result["examples"]),
        "accuracy": result["accuracy"],
        "loss": result["loss"],
        "macs": candidate.macs,
        "params": candidate.params,
        "multiplier": candidate.multiplier,
    }
    return RecordDict({METRICS: MetricRecord(metrics)})
