"""Communication, compute and exposure accounting of routed training (FEAST paper sections 4-5).

Communication is counted in parameters (what the paper reports: a full-supernet round trip is
2·P per client, a routed one 2·P_i, so ratios do not depend on the factor 2) and in the bytes of
the arrays actually sent. Exposure asks how often a routed position can be updated at all: a
position routed by R of N clients is covered in a round with m sampled clients with probability
1 - C(N - R, m) / C(N, m).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedapp.evaluation.results import write_csv
from fedapp.models.slicing import is_averaged, leading_slice
from fedapp.wire.messages import COMPUTE_METRIC, CPU_PERCENT, PEAK_RSS_MB, WALL_SECONDS

COMMUNICATION_FILE = "communication.csv"  # one row per accepted client-round
CLIENT_WORK_FILE = "client_work.csv"  # one row per metered client-round: device, seconds, memory
FLEET_FILE = "fleet.csv"  # one row per timed client-round: device class, fleet seconds, outcome


def coverage_probability(population: int, cohort: int, routed_by: int) -> float:
    """Probability that at least one of ``routed_by`` clients is in a uniform cohort."""
    if not 0 <= routed_by <= population or not 0 < cohort <= population:
        raise ValueError(
            f"need 0 <= R <= N and 0 < m <= N, got N={population}, m={cohort}, R={routed_by}"
        )
    return 1.0 - math.comb(population - routed_by, cohort) / math.comb(population, cohort)


@dataclass
class CommunicationLedger:
    """Parameters and bytes of every accepted client-round, against full-model transmission."""

    full_params: int
    client_rounds: list[dict[str, int]] = field(default_factory=list)

    def add(
        self, server_round: int, partition_id: int, params: int, bytes_down: int, bytes_up: int
    ) -> None:
        """One accepted client-round: routed parameters, bytes sent and received."""
        self.client_rounds.append(
            {
                "round": server_round,
                "partition": partition_id,
                "full_params": self.full_params,
                "params": params,
                "bytes_down": bytes_down,
                "bytes_up": bytes_up,
            }
        )

    def round_bytes(self, server_round: int) -> tuple[int, int]:
        """Bytes sent down and up in one round's accepted client-rounds (its metrics row)."""
        rows = [row for row in self.client_rounds if row["round"] == server_round]
        return sum(r["bytes_down"] for r in rows), sum(r["bytes_up"] for r in rows)

    def summary(self, params_by_client: Mapping[int, int] | None = None) -> dict[str, float]:
        """Per client-round means and reductions; per-client figures over the population
        (``params_by_client``: what each client would receive; default: its mean over the
        client-rounds it took part in)."""
        if params_by_client is None:
            taken: dict[int, list[int]] = {}
            for row in self.client_rounds:
                taken.setdefault(row["partition"], []).append(row["params"])
            params_by_client = {pid: float(np.mean(p)) for pid, p in taken.items()}
        if not params_by_client:
            return {"full_params": float(self.full_params), "client_rounds": 0.0}
        per_client = np.array([self.full_params / p for p in params_by_client.values()])
        routed = np.array([r["params"] for r in self.client_rounds], dtype=np.float64)
        out = {
            "full_params": float(self.full_params),
            "client_reduction_mean": float(per_client.mean()),
            "client_reduction_median": float(np.median(per_client)),
            "client_reduction_max": float(per_client.max()),
            "client_rounds": float(len(routed)),
        }
        if len(routed):
            out |= {
                "mean_params_per_client_round": float(routed.mean()),
                "aggregate_reduction": float(len(routed) * self.full_params / routed.sum()),
                "bytes_down_total": float(sum(r["bytes_down"] for r in self.client_rounds)),
                "bytes_up_total": float(sum(r["bytes_up"] for r in self.client_rounds)),
            }
        return out


def exposure(
    global_shapes: Mapping[str, tuple[int, ...]],
    routes: Sequence[Mapping[str, tuple[int, ...]]],
    cohort: int,
) -> dict[str, Any]:
    """How many clients route each position, and its per-round coverage probability.

    ``routes`` holds every client's leading-slice shapes; positions that nobody routes are not
    part of the trained space and are left out. Step counters are not parameters and not counted.
    """
    population = len(routes)
    counts = {
        name: np.zeros(shape, dtype=np.int32)
        for name, shape in global_shapes.items()
        if is_averaged(name) and len(shape) > 0
    }
    for shapes in routes:
        for name, shape in shapes.items():
            if name in counts:
                counts[name][leading_slice(shape)] += 1
    values, positions = np.unique(
        np.concatenate([c[c > 0] for c in counts.values()]), return_counts=True
    )
    profiles = [
        {
            "routed_by": int(r),
            "positions": int(n),
            "coverage": coverage_probability(population, cohort, int(r)),
        }
        for r, n in zip(values, positions, strict=True)
    ]
    return {
        "population": population,
        "cohort": cohort,
        "r_min": int(values[0]),
        "min_coverage": profiles[0]["coverage"],
        "profiles": profiles,
    }


def work_by_device(client_work: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind of device (``aarch64/cpu``, ``x86_64/cuda``): client-rounds, mean and largest
    seconds of local work, largest peak memory."""
    by_device: dict[str, list[Mapping[str, Any]]] = {}
    for row in client_work:
        by_device.setdefault(str(row["device"]), []).append(row)
    return {
        device: {
            "client_rounds": len(rows),
            "seconds_mean": float(np.mean([r["seconds"] for r in rows])),
            "seconds_max": float(max(r["seconds"] for r in rows)),
            "peak_rss_mb_max": float(max(r["peak_rss_mb"] for r in rows)),
        }
        for device, rows in sorted(by_device.items())
    }


@dataclass
class RunAccounts:
    """What a run's accepted client-rounds add up to, kept apart from any method: traffic (the
    ledger), compute each partition reported, each client-round's metered work and the device
    that did it, each valid client-round's time on the fleet and whether its round kept it, and
    the operating points some client trained directly. One instance per run,
    recorded once per accepted reply and checkpointed, so a resumed run reports the whole run."""

    ledger: CommunicationLedger = field(default_factory=lambda: CommunicationLedger(0))
    compute_proxy: dict[int, float] = field(default_factory=dict)
    client_work: list[dict[str, Any]] = field(default_factory=list)
    fleet: list[dict[str, Any]] = field(default_factory=list)
    trained_points: set[Hashable] = field(default_factory=set)

    def record(
        self,
        server_round: int,
        partition: int,
        device: str,
        sent: tuple[int, int],
        bytes_up: int,
        metrics: Mapping[str, Any],
    ) -> None:
        """One accepted client-round: ``sent`` is (parameters, bytes) of its payload."""
        self.ledger.add(server_round, partition, sent[0], sent[1], bytes_up)
        if {CPU_PERCENT, PEAK_RSS_MB, WALL_SECONDS} <= set(metrics):
            self.client_work.append(
                {
                    "round": server_round,
                    "partition": partition,
                    "device": device,
                    "seconds": float(metrics[WALL_SECONDS]),
                    "cpu_percent": float(metrics[CPU_PERCENT]),
                    "peak_rss_mb": float(metrics[PEAK_RSS_MB]),
                }
            )
        if COMPUTE_METRIC in metrics:
            self.compute_proxy[partition] = self.compute_proxy.get(partition, 0.0) + float(
                metrics[COMPUTE_METRIC]
            )

    def record_fleet(
        self, server_round: int, partition: int, device: str, seconds: float, outcome: str
    ) -> None:
        """One valid client-round on the fleet's clock: its class, seconds and whether the
        round's policy kept it (``kept``, ``late``, ``surplus``)."""
        self.fleet.append(
            {
                "round": server_round,
                "partition": partition,
                "device": device,
                "fleet_seconds": seconds,
                "outcome": outcome,
            }
        )

    def to_checkpoint(self) -> dict[str, Any]:
        """The accounts as JSON-ready values."""
        return {
            "ledger_full_params": self.ledger.full_params,
            "ledger_rows": [dict(row) for row in self.ledger.client_rounds],
            "compute_proxy": dict(self.compute_proxy),
            "client_work": [dict(row) for row in self.client_work],
            "fleet": [dict(row) for row in self.fleet],
            "trained_points": sorted(self.trained_points),
        }

    @classmethod
    def from_checkpoint(cls, stored: Mapping[str, Any]) -> RunAccounts:
        """Accounts of :meth:`to_checkpoint`; a checkpoint from before client_work.csv kept only
        (cpu, memory) pairs, which become rows without a device."""
        return cls(
            ledger=CommunicationLedger(
                full_params=int(stored["ledger_full_params"]),
                client_rounds=[dict(row) for row in stored["ledger_rows"]],
            ),
            compute_proxy={int(k): float(v) for k, v in stored["compute_proxy"].items()},
            client_work=[dict(row) for row in stored.get("client_work", [])]
            or [
                {"cpu_percent": cpu, "peak_rss_mb": rss}
                for cpu, rss in stored.get("resource_use", [])
            ],
            fleet=[dict(row) for row in stored.get("fleet", [])],
            trained_points=set(stored["trained_points"]),
        )

    def summary(
        self, run_dir: Path, params_by_client: Mapping[int, int] | None = None
    ) -> dict[str, Any]:
        """Communication and compute of the run, for summary.json; writes communication.csv and
        client_work.csv beside it."""
        if self.ledger.client_rounds:
            write_csv(run_dir / COMMUNICATION_FILE, self.ledger.client_rounds)
        if self.client_work:
            write_csv(run_dir / CLIENT_WORK_FILE, self.client_work)
        if self.fleet:
            write_csv(run_dir / FLEET_FILE, self.fleet)
        use = np.array([[r["cpu_percent"], r["peak_rss_mb"]] for r in self.client_work])
        use = use.reshape(-1, 2)
        comm = self.ledger.summary(params_by_client)
        clients = max(len({row["partition"] for row in self.ledger.client_rounds}), 1)
        traffic_mb = (comm.get("bytes_down_total", 0.0) + comm.get("bytes_up_total", 0.0)) / 2**20
        return {
            "resources": {
                "cpu_percent_mean": float(use[:, 0].mean()) if len(use) else None,
                "peak_rss_mb_mean": float(use[:, 1].mean()) if len(use) else None,
                "peak_rss_mb_max": float(use[:, 1].max()) if len(use) else None,
                "metered_client_rounds": len(use),
                "comm_mb_per_client": traffic_mb / clients,
                "comm_mb_total": traffic_mb,
            },
            "work_by_device": work_by_device(self.client_work),
            "comm": comm,
            "compute_proxy_total_macs": self.compute_total(),
            "compute_proxy_by_client": {str(k): v for k, v in sorted(self.compute_proxy.items())},
        }

    def compute_total(self) -> float:
        """Training compute (MACs) all partitions reported."""
        return float(sum(self.compute_proxy.values()))
