"""The one model a logit-exchange client owns (FedMD, FedDistill): chosen, kept, evaluated.

These methods exchange predictions, never weights, so each client's model lives only on the client:
it is the largest candidate of the run's family (``candidates.family``) that the client's budget
affords, built once, and kept across rounds in the node's Flower state. The server asks for its
accuracy through EVALUATE messages (``evaluators.ClientModels``).
"""

from __future__ import annotations

from flwr.app import Message, RecordDict
from torch import nn

from fedapp.data.registry import DatasetInfo
from fedapp.methods.common.evaluation_reply import candidate_costs, evaluation_reply, no_model_reply
from fedapp.methods.common.node_state import load_arrays, save_arrays
from fedapp.models.families import Candidate, build_candidate, largest_affordable
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.run.run_models import run_candidates
from fedapp.wire.records import load_state

MODEL_KEY = "kept-model"  # node-state key of the client's own model


def own_candidate(run: RunContext, info: DatasetInfo, budget: float) -> Candidate:
    """The largest candidate the budget affords; BudgetError when none does."""
    return largest_affordable(run_candidates(run.family, info), budget)


def load_own_model(run: RunContext, node: LocalNode, info: DatasetInfo) -> tuple[nn.Module, bool]:
    """(this node's model, whether it is new): the kept weights if any, else a fresh build."""
    model = build_candidate(own_candidate(run, info, node.budget).name, info)
    saved = load_arrays(node.state, MODEL_KEY)
    if saved is not None:
        load_state(model, saved)
    return model, saved is None


def keep_own_model(node: LocalNode, model: nn.Module) -> None:
    """Store the model in the node's state for its next message."""
    save_arrays(node.state, MODEL_KEY, model.state_dict())


def evaluate_own_model(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """Client evaluator: this node's kept model on the server-held split the message names (a
    node that has not trained yet has no model: :func:`no_model_reply`)."""
    if load_arrays(node.state, MODEL_KEY) is None:
        return no_model_reply()
    info = run.info
    model, _ = load_own_model(run, node, info)
    costs = candidate_costs(own_candidate(run, info, node.budget))
    return evaluation_reply(model, message, run, costs)
