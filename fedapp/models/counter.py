"""Analytic MACs and parameters, in the FEAST paper's convention.

MACs count convolutions (``cin * cout * k * k * Hout * Wout``) and the linear head
(``in * classes``); BN, ReLU, pooling and the residual add are free. Parameters count conv weights
(no conv bias), BN weight and bias, and the head's weight and bias. The counter works on whole
populations of integer-encoded architectures at once (the GA evaluates 256 per generation), and the
single-architecture API is the same code with a population of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.models.arch import Arch, SupernetConfig


@dataclass(frozen=True)
class Cost:
    """Inference cost of one architecture (per example) and its size."""

    macs: int
    params: int


@dataclass(frozen=True)
class Geometry:
    """Per-stage channel and spatial arrays of a population (shape ``(P, S)`` unless noted)."""

    depth: np.ndarray  # extra blocks d
    stem: np.ndarray  # (P,) stem output channels
    cin: np.ndarray  # input channels of each stage's first block
    cout: np.ndarray
    mid: np.ndarray
    size: np.ndarray  # (S,) spatial output size of each stage


def geometry(config: SupernetConfig, genes: np.ndarray) -> Geometry:
    """Channel counts of a population from its gene matrix ``(P, 3S+1)``."""
    genes = np.atleast_2d(np.asarray(genes, dtype=np.int64))
    s = config.num_stages
    depth, e_idx, w_idx = genes[:, :s], genes[:, s : 2 * s], genes[:, 2 * s :]
    stage_rows = np.arange(1, s + 1)
    stem = config.channel_table[0, w_idx[:, 0]]
    cout = config.channel_table[stage_rows, w_idx[:, 1:]]
    mid = config.mid_table[stage_rows - 1, w_idx[:, 1:], e_idx]
    cin = np.concatenate([stem[:, None], cout[:, :-1]], axis=1)
    return Geometry(
        depth=depth,
        stem=stem,
        cin=cin,
        cout=cout,
        mid=mid,
        size=np.asarray(config.stage_sizes, dtype=np.int64),
    )


def count_population(config: SupernetConfig, genes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MACs and parameters (int64 arrays of length P) of every architecture in ``genes``."""
    g = geometry(config, genes)
    k2 = config.stem_kernel**2
    area = g.size**2
    projected = np.asarray(config.projected, dtype=np.int64)
    # First block: conv1 (cin->mid), conv2 (mid->cout), projection 1x1 (cin->cout) if any.
    first_macs = (9 * g.cin * g.mid + 9 * g.mid * g.cout + projected * g.cin * g.cout) * area
    other_macs = g.depth * 18 * g.cout * g.mid * area
    macs = (
        config.in_channels * g.stem * k2 * config.stem_conv_size**2
        + (first_macs + other_macs).sum(axis=1)
        + g.cout[:, -1] * config.num_classes
    )
    first_params = (9 * g.cin * g.mid + 2 * g.mid + 9 * g.mid * g.cout + 2 * g.cout) + projected * (
        g.cin * g.cout + 2 * g.cout
    )
    other_params = g.depth * (18 * g.cout * g.mid + 2 * g.mid + 2 * g.cout)
    params = (
        config.in_channels * g.stem * k2
        + 2 * g.stem
        + (first_params + other_params).sum(axis=1)
        + (g.cout[:, -1] + 1) * config.num_classes
    )
    return macs, params


def count(config: SupernetConfig, arch: Arch) -> Cost:
    """MACs and parameters of one architecture (also of a routed envelope, see ``routing``)."""
    macs, params = count_population(config, config.genes(arch))
    return Cost(macs=int(macs[0]), params=int(params[0]))
