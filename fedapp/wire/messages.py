"""What travels between server and clients for every method: the record keys, config keys and metric
names that the apps, the round engine and more than one method read (plain strings: no Flower, no
torch; fedapp.wire.records converts). A method's own keys are in its folder's ``keys.py``.

Both sides name records through these constants, so a payload and its reply agree by
construction; the server still validates every reply (fedapp.methods.common.reply_validation).
"""

from __future__ import annotations

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
NUM_EXAMPLES = "num-examples"
#: Config key of an EVALUATE message: which server-held split a client evaluates on.
EVAL_SPLIT = "split"
#: ConfigRecord of a node's QUERY reply: its profile (the handshake, fedapp.run.profiles).
PROFILE = "profile"
#: Config record of every QUERY and TRAIN message: the run's data-set facts
#: (fedapp.run.federated_data.data_facts), so that a device need not load the data set for them.
DATA_FACTS = "data"

# ---- train-config keys every method's message carries ------------------------------------------
SERVER_ROUND = "server-round"
LEARNING_RATE = "learning-rate"

# ---- metric names the server reads ------------------------------------------------------------
#: The validation metric that selects the best checkpoint.
SELECTION_KEY = "val-accuracy"
#: The reply metric in which a client reports its training compute (MACs, forward + backward).
COMPUTE_METRIC = "compute-proxy-macs"
#: What every trainer's reply says of its local work (fedapp.training.train_metrics): the
#: server's round log and timing read them.
TRAIN_LOSS = "train-loss"
TRAIN_STEPS = "train-steps"
TRAIN_SECONDS = "train-seconds"
#: A client's metered resources (fedapp.methods.common.metering); the server averages CPU and
#: memory.
CPU_PERCENT = "cpu-percent"
PEAK_RSS_MB = "peak-rss-mb"
WALL_SECONDS = "wall-seconds"
TORCH_THREADS = "torch-threads"
#: An EVALUATE reply (fedapp.methods.common.evaluation_reply), also the keys of a local evaluation's
#: result (fedapp.training.loops.evaluate): accuracy and mean loss on the named split; a family
#: model's reply adds its width multiplier, by which the server names it.
ACCURACY = "accuracy"
LOSS = "loss"
MULTIPLIER = "multiplier"

#: Logit exchange: a client's (M, C) logits on the public (FedKD-NAS) or alignment set (FedMD).
LOGITS = "logits"
