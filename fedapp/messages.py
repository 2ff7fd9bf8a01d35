"""What travels between server and clients: every record key, config key and metric name that
both halves of a method read (plain strings: no Flower, no torch; fedapp.records converts).

Both sides name records through these constants, so a payload and its reply agree by
construction; the server still validates every reply (fedapp.strategies.reply_validation).
"""

from __future__ import annotations

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
NUM_EXAMPLES = "num-examples"
#: Config key of an EVALUATE message: which server-held split a client evaluates on.
EVAL_SPLIT = "split"
#: ConfigRecord of a node's QUERY reply: its profile (the handshake, fedapp.profiles).
PROFILE = "profile"
#: Config record of every QUERY and TRAIN message: the run's data-set facts
#: (fedapp.federated_data.data_facts), so that a device need not load the data set for them.
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
#: A client's metered resources (fedapp.clients.metering); the server averages CPU and memory.
CPU_PERCENT = "cpu-percent"
PEAK_RSS_MB = "peak-rss-mb"
WALL_SECONDS = "wall-seconds"
TORCH_THREADS = "torch-threads"
#: An EVALUATE reply (fedapp.clients.evaluation_reply), also the keys of a local evaluation's
#: result (fedapp.training.loops.evaluate): accuracy and mean loss on the named split; a family
#: model's reply adds its width multiplier, by which the server names it.
ACCURACY = "accuracy"
LOSS = "loss"
MULTIPLIER = "multiplier"

# ---- method payloads, replies and train-config keys -------------------------------------------
#: FEAST: the cache indices a client affords, and whether it received its routed envelope.
AFFORDABLE = "affordable"
ROUTED = "routed"
#: SuperFedNAS/DeepFedNAS: the assigned subnet's architecture string.
SUBNET = "subnet"
#: HeteroFL: the width a client trains; reply array, 1.0 for each class present in its shard.
WIDTH_KEY = "width"
LABEL_MASK = "label-mask"
#: ScaleFL: the depth/width level a client trains.
LEVEL = "level"
#: FIARSE: per masked tensor (in masked_names order) keep |w| >= its threshold; effective
#: forward MACs per example of the client's mask.
THRESHOLDS = "mask-thresholds"
MASK_MACS = "mask-macs"
#: FedDF: the prototype (architecture name) a client trains.
PROTOTYPE = "prototype"
#: Logit exchange: a client's (M, C) logits on the public (FedKD-NAS) or alignment set (FedMD).
LOGITS = "logits"
#: FedKD-NAS/Local-KD payload: the (M, C) logits to distil from.
TARGET = "target"
#: FedMD payload: the last consensus (alignment-size, classes) and its alignment round (0: none).
CONSENSUS = "consensus"
CONSENSUS_ROUND = "consensus-round"
#: FedDistill reply: per-label mean logits (classes, classes) and how many logits each averages;
#: payload: the global per-label logits and where one exists (1.0).
LABEL_LOGITS = "label-logits"
LABEL_COUNTS = "label-counts"
GLOBAL_LOGITS = "global-logits"
GLOBAL_PRESENT = "global-present"
#: FedKD-NAS/Local-KD reply metrics: the round's student (width multiplier, MACs, score,
#: hold-out accuracy and the steps behind it, whether it switched or was warm-started) and its
#: duel's rival (multiplier, score, steps, accuracy; NO_RIVAL where none).
NAS_MULTIPLIER = "nas-multiplier"
NAS_MACS = "nas-macs"
NAS_SCORE = "nas-score"
NAS_SWITCHED = "nas-switched"
NAS_WARM_START = "nas-warm-start"
NAS_HOLDOUT_ACCURACY = "nas-holdout-accuracy"
NAS_STEPS = "nas-steps"
NAS_RIVAL_MULTIPLIER = "nas-rival-multiplier"
NAS_RIVAL_SCORE = "nas-rival-score"
NAS_RIVAL_STEPS = "nas-rival-steps"
NAS_RIVAL_ACCURACY = "nas-rival-accuracy"
NO_RIVAL = -1.0  # the rival metrics of a round without a duel
#: Why a round's student is what it is (reply metric NAS_REASON: the index in NAS_REASONS).
NAS_REASON = "nas-reason"
NAS_REASONS = ("start", "incumbent", "duel-kept", "duel-switched")
