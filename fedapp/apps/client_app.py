"""ClientApp: validate the run config, answer the handshake, dispatch training (and, for methods
whose models live on the clients, evaluation) to the method."""

from __future__ import annotations

import math
import sys

import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedapp.data.extras import MissingExtraError
from fedapp.data.registry import DatasetUnavailableError
from fedapp.method_table import NoClientEvaluator, client_evaluator, client_trainer
from fedapp.methods.common.metering import ResourceMeter
from fedapp.methods.common.state_store import StateStore
from fedapp.run.config import ConfigError, RunConfig, parse_run_config
from fedapp.run.context import piece, run_context
from fedapp.run.federated_data import adopt_data_facts
from fedapp.run.pieces import DataSource
from fedapp.run.profiles import local_node, local_profile
from fedapp.wire.messages import CONFIG, DATA_FACTS, METRICS, PROFILE, SERVER_ROUND

app = ClientApp()

#: User errors a node reports to the server as a readable reason instead of a traceback (a
#: device's base install asked to cut a shard of a shared data set lacks the ``data`` extra).
USER_ERRORS = (ConfigError, DatasetUnavailableError, MissingExtraError)


def _config(context: Context, message: Message) -> RunConfig:
    """The run config; the data-set facts the server sent with the message are remembered, so
    the node does not load the data set for them (fedapp.run.federated_data). Torch's threads are
    set before any work (see ``_pin_torch_threads``)."""
    cfg = parse_run_config(context.run_config)
    if DATA_FACTS in message.content.config_records:
        adopt_data_facts(piece(DataSource, cfg), message.content.config_records[DATA_FACTS])
    _pin_torch_threads(cfg)
    return cfg


def _pin_torch_threads(cfg: RunConfig) -> None:
    """``client-threads`` torch threads, by default one per CPU Ray gave this actor.

    Ray sets an actor's ``OMP_NUM_THREADS`` to its CPUs only where the variable is unset, so a
    value inherited from the shell or a container let every actor run one thread per core of
    the machine: two 1-CPU actors on 2 cores then share them with four threads, and quickstart
    rounds take 2-3x as long (benchmarks/cpu_sensitivity.py). Outside Ray (deployment) torch's
    default stays unless the key sets a number.
    """
    threads = cfg.client_threads or _ray_actor_cpus()
    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _ray_actor_cpus() -> int:
    """The CPUs Ray assigned to this process (floored, at least 1, as Ray's own rule); 0 when
    this process is no Ray worker."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return 0
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(math.floor(cpus), 1)


def _refuse(message: Message, err: Exception) -> Message:
    return Message(
        Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(err)), reply_to=message
    )


@app.query()
def query(message: Message, context: Context) -> Message:
    """The handshake: report this node's profile."""
    try:
        profile = local_profile(context, run_context(_config(context, message)).data)
    except USER_ERRORS as err:
        return _refuse(message, err)
    return Message(RecordDict({PROFILE: profile}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round of the configured method's local training, continuing the node's state as of
    the round before (fedapp.methods.common.state_store) and keeping it afterwards."""
    try:
        cfg = _config(context, message)
        run = run_context(cfg)
        node = local_node(context.node_config, run.data, context.state)
        store = StateStore.for_node(context.node_config, context.run_config, cfg, node)
    except USER_ERRORS as err:
        return _refuse(message, err)
    server_round = int(message.content[CONFIG][SERVER_ROUND])
    store.prepare(node.state, upto=server_round - 1)
    with ResourceMeter() as meter:
        content = client_trainer(run.strategy)(message, run, node)
    store.commit(node.state, server_round)
    if METRICS in content.metric_records:
        content.metric_records[METRICS].update(meter.use.as_metrics())
    return Message(content, reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Evaluate this node's own model(s) on the server-held split the message names."""
    try:
        cfg = _config(context, message)
        run = run_context(cfg)
        node = local_node(context.node_config, run.data, context.state)
        store = StateStore.for_node(context.node_config, context.run_config, cfg, node)
        evaluator = client_evaluator(run.strategy)
    except (*USER_ERRORS, NoClientEvaluator) as err:
        return _refuse(message, err)
    store.prepare(node.state, upto=None)
    return Message(evaluator(message, run, node), reply_to=message)
