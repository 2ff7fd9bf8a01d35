"""A digest of every strategy's 2-round results on ``digits``, to show a refactor preserves them.

Runs each method of the two shipped comparisons (weight-sharing and FedKD-NAS families) for two
rounds on 4 in-process nodes (tests/support/local_grid.py: the real ClientApp, messages through
Flower's serialisation) with one torch thread, and prints one SHA-256 digest per strategy over
its final model, its per-round metrics (timings and metered resources left out), its CSV files
and the summary's figures. Run it before and after a change and diff the two outputs:

    python scripts/results_digest.py /tmp/before > before.txt   # on the old commit
    python scripts/results_digest.py /tmp/after > after.txt     # on the new one
    diff before.txt after.txt
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from local_grid import run_local  # noqa: E402

from fedapp.tools.compare import load_comparison  # noqa: E402

SHARED = [
    "dataset=digits",
    "num-server-rounds=2",
    "num-clients=4",
    "fraction-train=1.0",
    "eval-every=1",
    "budget-min=2e5",
    "budget-max=6e6",
    "allocation-cap=4.2e6",
]
COMPARISONS = {
    "weight-sharing-mnist5k": {
        "feast-space.variant-cache": "feast-small-digits",
        "fiarse.grid-points": 3,
    },
    "fedkd-mnist5k": {
        "public-size": 100,
        "validation-size": 200,
        "budget-min": 6.5e4,
        "budget-max": 1.5e6,
        "fedkd-nas.teacher-epochs": 2,
        "fedmd.alignment-size": 50,
    },
}
RESULT_FILES = ("variants.csv", "clients.csv", "population.csv", "communication.csv")
NAS_FILE = "nas_choices.csv"
SUMMARY_KEYS = (
    "test_accuracy",
    "test_loss",
    "population_accuracy",
    "variants",
    "comm",
    "compute_proxy_total_macs",
    "best_round",
)
#: Metrics that measure the machine, not the method.
MACHINE_METRICS = ("second", "time", "cpu", "rss", "mem")


def digest(run_dir: Path) -> str:
    h = hashlib.sha256()
    state = torch.load(run_dir / "model_final.pt", weights_only=True)
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].cpu().numpy().tobytes())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kept = [
        {k: v for k, v in row.items() if not any(m in k for m in MACHINE_METRICS)} for row in rows
    ]
    h.update(json.dumps(kept, sort_keys=True).encode())
    for name in (*RESULT_FILES, NAS_FILE):
        if (run_dir / name).exists():
            h.update((run_dir / name).read_bytes())
    summary = json.loads((run_dir / "summary.json").read_text())
    figures = {k: summary[k] for k in SUMMARY_KEYS if k in summary}
    h.update(json.dumps(figures, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def main(out_dir: Path, only: list[str]) -> None:
    torch.set_num_threads(1)
    for name, extra in COMPARISONS.items():
        comparison = load_comparison(name, sets=SHARED)
        for strategy in comparison.strategies:
            if only and strategy not in only:
                continue
            config = comparison.run_config(strategy) | extra
            summary, _ = run_local(config | {"out-dir": str(out_dir), "run-name": strategy}, 4)
            print(f"{strategy:12s} {digest(out_dir / strategy)} acc={summary['test_accuracy']}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/results_digest.py OUT_DIR [strategy ...]")
    main(Path(sys.argv[1]), sys.argv[2:])
