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
#: FedKD-NAS/Local-KD: why a round's student is what it is (reply metric ``nas-reason``: the index).
NAS_REASONS = ("start", "incumbent", "duel-kept", "duel-switched")
