"""Client evaluators: a model held on the client, tested on the server-held split an EVALUATE
message names (Ditto's personal models, FedMD/FedDistill's kept models, FedKD-NAS's students).

Every such evaluator answers the same metrics, so the server averages them alike
(``fedapp.methods.common.evaluators.ClientModels``).
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import Message, MetricRecord, RecordDict
from torch import nn

from fedapp.evaluation.operating_points import EVAL_BATCH_SIZE
from fedapp.models.families import Candidate
from fedapp.run.context import RunContext
from fedapp.run.federated_data import server_set
from fedapp.training.loops import eval_loader, evaluate, resolve_device
from fedapp.wire.messages import (
    ACCURACY,
    CONFIG,
    EVAL_SPLIT,
    LOSS,
    METRICS,
    MULTIPLIER,
    NUM_EXAMPLES,
)


def no_model_reply() -> RecordDict:
    """What a node without a model (never trained) answers: zero examples, which the server
    drops with a logged reason instead of averaging in an untrained model."""
    return RecordDict({METRICS: MetricRecord({NUM_EXAMPLES: 0})})


def evaluation_reply(
    model: nn.Module,
    message: Message,
    run: RunContext,
    extra: Mapping[str, int | float] | None = None,
) -> RecordDict:
    """The model's accuracy and loss on the split the message names, plus ``extra`` metrics."""
    data = server_set(run.data, str(message.content[CONFIG][EVAL_SPLIT]))
    result = evaluate(
        model, eval_loader(data, run.info, EVAL_BATCH_SIZE), resolve_device(run.training.device)
    )
    metrics = {
        NUM_EXAMPLES: int(result["examples"]),
        ACCURACY: result[ACCURACY],
        LOSS: result[LOSS],
    }
    return RecordDict({METRICS: MetricRecord(metrics | dict(extra or {}))})


def candidate_costs(candidate: Candidate) -> dict[str, int | float]:
    """A family model's costs, reported with its evaluation."""
    return {"macs": candidate.macs, "params": candidate.params, MULTIPLIER: candidate.multiplier}
