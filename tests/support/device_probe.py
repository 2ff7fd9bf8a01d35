"""What a device's ClientApp does with the base install: run in a fresh interpreter by
tests/unit/test_dependencies.py, with the Python of the tests (``--block`` makes the data extra's
packages and Ray unimportable, as if they were not installed) or of a device's venv (they are not).

It sends the real ClientApp the handshake (QUERY, with the data-set facts the server sends) as two
nodes of a digits run: one with its own .npz file (node config ``data-path``), which must answer
with its size, and one without, which must cut a shard of digits (the data extra) and, where that
is missing, refuse with a message naming the install. It prints one JSON line.

usage: python device_probe.py [--block] WORK_DIR
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

#: Packages a device with its own data must not need: the data extra's and the simulation's.
ABSENT = (
    "ray",
    "matplotlib",
    "seaborn",
    "pandas",
    "scipy",
    "sklearn",
    "mlxtend",
    "flwr_datasets",
    "datasets",
    "pyarrow",
    "huggingface_hub",
)
REPO = Path(__file__).resolve().parents[2]
DIGITS_FACTS = {
    "name": "digits",
    "num-classes": 10,
    "channels": 1,
    "image-size": 8,
    "mean": [0.3],
    "std": [0.4],
    "augmentation": "none",
    "has-test-split": False,
}


def _query(app: Any, node_config: dict[str, Any], run_config: dict[str, Any]) -> Any:
    """The handshake as the SuperLink delivers it to one node; the ClientApp's reply."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedapp.wire.messages import DATA_FACTS

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1001, 1
    content = RecordDict({DATA_FACTS: ConfigRecord(DIGITS_FACTS)})
    message = Message(content, dst_node_id=1001, message_type=MessageType.QUERY, group_id="0")
    message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
    message.metadata.__dict__["_src_node_id"] = 1
    context = Context(
        run_id=1, node_id=1001, node_config=node_config, state=RecordDict(), run_config=run_config
    )
    return app(message, context)


def main(argv: list[str]) -> int:
    block = "--block" in argv
    work = Path(next(a for a in argv if a != "--block"))
    os.environ["FEDAPP_CACHE_DIR"] = str(work / "cache")  # no shard cached by an earlier run
    if block:
        for name in ABSENT:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ModuleNotFoundError
    import numpy as np
    from flwr.common.config import get_fused_config_from_dir

    import fedapp.methods.feast.client
    import fedapp.methods.fedavg.client  # noqa: F401  (the trainers a digits run dispatches to)
    from fedapp.apps.client_app import app
    from fedapp.wire.messages import PROFILE

    run_config = get_fused_config_from_dir(
        REPO, {"dataset": "digits", "num-clients": 2, "partitioner": "iid"}
    )
    rng = np.random.default_rng(0)
    own = work / "own.npz"
    np.savez(own, x_train=rng.integers(0, 256, (37, 8, 8), np.uint8), y_train=np.arange(37) % 10)

    with_data = _query(
        app, {"partition-id": 0, "num-partitions": 2, "data-path": str(own)}, run_config
    )
    without = _query(app, {"partition-id": 1, "num-partitions": 2}, run_config)
    result = {
        "own-data-examples": (
            None if with_data.has_error() else with_data.content[PROFILE]["num-examples"]
        ),
        "own-data-error": with_data.error.reason if with_data.has_error() else None,
        "shard-error": without.error.reason if without.has_error() else None,
        "loaded": [name for name in ABSENT if sys.modules.get(name) is not None],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
