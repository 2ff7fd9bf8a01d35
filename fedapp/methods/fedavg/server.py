"""FedAvg (McMahan et al., 2017): every sampled client trains the whole model; the server takes
the sample-weighted mean and evaluates it centrally. It is the whole-model strategy unchanged."""

from __future__ import annotations

from fedapp.methods.common.whole_model_server import WholeModelStrategy


class FedAvgStrategy(WholeModelStrategy):
    """FedAvg: the whole-model strategy, with nothing added."""
