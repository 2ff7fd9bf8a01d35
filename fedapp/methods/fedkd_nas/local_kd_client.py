"""Local-KD client, FedKD-NAS's no-coordination ablation: the same NAS controller and CE + KD round
as FedKD-NAS (fedapp.methods.fedkd_nas.client), distilling from the teacher's logits it kept the
first time they arrived; it uploads nothing."""

from __future__ import annotations

from flwr.app import Message, MetricRecord, RecordDict

from fedapp.methods.common.node_state import load_arrays, save_arrays
from fedapp.methods.fedkd_nas.client import local_round
from fedapp.methods.fedkd_nas.keys import TARGET
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.wire.messages import ARRAYS, METRICS
from fedapp.wire.records import from_record, to_record

LOCAL_TARGET_KEY = "local-kd-target"  # Local-KD: the teacher's logits, kept after round 1


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """Local-KD: keep the teacher's logits the first time they arrive; exchange nothing."""
    arrays = from_record(message.content[ARRAYS])
    if TARGET in arrays:
        save_arrays(node.state, LOCAL_TARGET_KEY, {TARGET: arrays[TARGET]})
    kept = load_arrays(node.state, LOCAL_TARGET_KEY)
    _, metrics = local_round(message, run, node, None if kept is None else kept[TARGET])
    return RecordDict({ARRAYS: to_record({}), METRICS: MetricRecord(metrics)})
