"""ClientApp: validate the run config, answer the handshake, dispatch training (and, for methods
whose models live on the clients, evaluation) to the method."""

from __future__ import annotations

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedapp.clients.metering import ResourceMeter
from fedapp.config import ConfigError, RunConfig, parse_run_config
from fedapp.data.registry import DatasetUnavailableError
from fedapp.federated_data import adopt_data_facts
from fedapp.messages import DATA_FACTS, METRICS, PROFILE
from fedapp.methods import NoClientEvaluator, client_evaluator, client_trainer
from fedapp.profiles import local_node, local_profile

app = ClientApp()

#: User errors a node reports to the server as a readable reason instead of a traceback.
USER_ERRORS = (ConfigError, DatasetUnavailableError)


def _config(context: Context, message: Message) -> RunConfig:
    """The run config; the data-set facts the server sent with the message are remembered, so
    the node does not load the data set for them (fedapp.federated_data)."""
    cfg = parse_run_config(context.run_config)
    if DATA_FACTS in message.content.config_records:
        adopt_data_facts(cfg, message.content.config_records[DATA_FACTS])
    return cfg


def _refuse(message: Message, err: Exception) -> Message:
    return Message(
        Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(err)), reply_to=message
    )


@app.query()
def query(message: Message, context: Context) -> Message:
    """The handshake: report this node's profile."""
    try:
        profile = local_profile(context, _config(context, message))
    except USER_ERRORS as err:
        return _refuse(message, err)
    return Message(RecordDict({PROFILE: profile}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round of the configured method's local training."""
    try:
        cfg = _config(context, message)
        node = local_node(context.node_config, cfg, context.state)
    except USER_ERRORS as err:
        return _refuse(message, err)
    with ResourceMeter() as meter:
        content = client_trainer(cfg.strategy)(message, cfg, node)
    if METRICS in content.metric_records:
        content.metric_records[METRICS].update(meter.use.as_metrics())
    return Message(content, reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Evaluate this node's own model(s) on the server-held split the message names."""
    try:
        cfg = _config(context, message)
        node = local_node(context.node_config, cfg, context.state)
        evaluator = client_evaluator(cfg.strategy)
    except (*USER_ERRORS, NoClientEvaluator) as err:
        return _refuse(message, err)
    return Message(evaluator(message, cfg, node), reply_to=message)
