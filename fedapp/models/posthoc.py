"""Post-hoc extraction: a new operating point from the trained supernet.

The GA searches the whole space under the requested MAC limit with the cache's fitness, the
winner's weights are cut from the supernet, and its BN statistics are recalibrated; nothing is
fine-tuned.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedapp.models.bn_calibration import Batch, recalibrate_bn
from fedapp.models.elastic_resnet import ElasticResNet, ResNet
from fedapp.models.ga import GAParams, SearchResult, search

#: The paper's post-hoc GA: a larger population than cache construction.
POSTHOC_GA = GAParams(population=512, generations=512)


def posthoc_rho0(mac_limit: float) -> float:
    """Effectiveness ceiling of the cache construction: 0.40 below 50M MACs, 0.31 above."""
    return 0.40 if mac_limit < 50e6 else 0.31


def extract_posthoc(
    supernet: ElasticResNet,
    mac_limit: float,
    calibration: Iterable[Batch],
    seed: int = 0,
    rho0: float | None = None,
    params: GAParams = POSTHOC_GA,
) -> tuple[SearchResult, ResNet]:
    """Search an architecture under ``mac_limit``, extract it and recalibrate its BN."""
    rho0 = posthoc_rho0(mac_limit) if rho0 is None else rho0
    found = search(supernet.config, mac_limit, rho0, seed, params)
    subnet = supernet.subnet(found.arch)
    recalibrate_bn(subnet, calibration, seed=seed)
    return found, subnet.eval()
