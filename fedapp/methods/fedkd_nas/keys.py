"""FedKD-NAS's and Local-KD's message keys: the payload and the NAS metrics of a reply. Both
halves of the method read them."""

from __future__ import annotations

#: FedKD-NAS/Local-KD payload: the (M, C) logits to distil from.
TARGET = "target"
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
