"""Bring run folders written by an earlier fedapp up to today's files, once, so fedapp reads them
without compatibility code.

Two things changed since the kept runs in docs/results were made:

- **Sections**: a method's keys were flat run-config keys (``kd-alpha``, ``fiarse-grid-points``);
  they are now ``<section>.<key>`` (``fedkd-nas.kd-weight``, ``fiarse.grid-points``), and the keys
  of a model space several methods share are a shared section (``supernet`` is
  ``feast-space.supernet``, ``substrate`` is ``substrate.supernet``, ``nas-family`` is
  ``candidates.family``; FEAST's ``routing`` is ``feast.routing``). Keys added since
  (``tensorboard``, ``max-weight-share``, ``budget-floor``, the ``fleet.*`` section: the
  default fleet, waiting for every reply) get the value the run behaved as;
  config.json is rewritten as today's ServerApp writes it (without the sections only other
  methods read), after today's checks accept it.
- **Intervals**: summary.json gained ``test_images`` and a 95 % Wilson interval beside every test
  and population accuracy, and every operating point (summary.json's ``variants``,
  variants.csv) its ``ci95_low``/``ci95_high``. A run without them gets them from the size of
  its test split, recomputed from its config (every accuracy it reports was measured on that
  whole split).

Each file is written whole (temporary file, renamed); a folder already up to date is left as it
is, so the script may run again. Usage:

    python scripts/migrate_run_folders.py docs/results/runs [more folders ...]   # every run below
    python scripts/migrate_run_folders.py --check docs/results/runs              # report only
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedapp.evaluation.intervals import HIGH, LOW, summary_intervals, wilson_interval
from fedapp.evaluation.operating_points import VARIANTS_FILE
from fedapp.evaluation.results import CONFIG_FILE, SUMMARY_FILE, read_json, replace_text
from fedapp.run.config import (
    ConfigError,
    RunConfig,
    fused_run_config,
    parse_saved_config,
)
from fedapp.run.context import data_layout
from fedapp.run.federated_data import server_set

REPO = Path(__file__).resolve().parents[1]
#: Flat keys before sections -> their key(s) in today's sections.
SECTIONED_KEYS: dict[str, tuple[str, ...]] = {
    "training-rule": ("feast.training-rule",),
    "kd-weight": ("feast.kd-weight",),
    "nas-lambda": ("fedkd-nas.lambda",),
    "nas-margin": ("fedkd-nas.margin",),
    "nas-keep": ("fedkd-nas.keep",),
    "nas-holdout": ("fedkd-nas.holdout",),
    "nas-memory-mb": ("fedkd-nas.memory-mb",),
    "nas-duel-every": ("fedkd-nas.duel-every",),
    "nas-warmup-steps": ("fedkd-nas.warmup-steps",),
    "nas-score-on": ("fedkd-nas.score-on",),
    "nas-public-holdout": ("fedkd-nas.public-holdout",),
    "kd-alpha": ("fedkd-nas.kd-weight",),
    "kd-temperature": ("fedkd-nas.kd-temperature", "feddf.kd-temperature"),
    "kd-steps": ("fedkd-nas.kd-steps",),
    "teacher-beta": ("fedkd-nas.teacher-beta",),
    "ema-gamma": ("fedkd-nas.ema-gamma",),
    "logit-aggregation": ("fedkd-nas.logit-aggregation",),
    "trim-fraction": ("fedkd-nas.trim-fraction",),
    "teacher-epochs": ("fedkd-nas.teacher-epochs",),
    "teacher-model": ("fedkd-nas.teacher-model",),
    "teacher-folds": ("fedkd-nas.teacher-folds",),
    "alignment-size": ("fedmd.alignment-size",),
    "pretrain-public-epochs": ("fedmd.pretrain-public-epochs",),
    "pretrain-private-epochs": ("fedmd.pretrain-private-epochs",),
    "digest-epochs": ("fedmd.digest-epochs",),
    "revisit-epochs": ("fedmd.revisit-epochs",),
    "feddistill-weight": ("feddistill.kd-weight",),
    "feddistill-exclude-own": ("feddistill.exclude-own",),
    "subnet-sampling": ("maxnet.subnet-sampling",),
    "maxnet-decay-fraction": ("maxnet.decay-fraction",),
    "maxnet-weight-examples": ("maxnet.weight-examples",),
    "ditto-lambda": ("ditto.lambda",),
    "distill-steps": ("feddf.distill-steps",),
    "distill-eval-every": ("feddf.distill-eval-every",),
    "distill-patience": ("feddf.distill-patience",),
    "distill-batch-size": ("feddf.distill-batch-size",),
    "distill-lr": ("feddf.distill-lr",),
    "distill-grad-clip": ("feddf.distill-grad-clip",),
    "heterofl-assignment": ("heterofl.assignment",),
    "fiarse-grid-points": ("fiarse.grid-points",),
    "fiarse-budget": ("fiarse.budget",),
    "fiarse-topk": ("fiarse.topk",),
    "scalefl-exit-convs": ("scalefl.exit-convs",),
    "scalefl-kd-gamma": ("scalefl.kd-weight",),
    "scalefl-kd-temperature": ("scalefl.kd-temperature",),
    "scalefl-kd-form": ("scalefl.kd-form",),
    "supernet": ("feast-space.supernet",),
    "variant-cache": ("feast-space.variant-cache",),
    "anchor-variants": ("feast-space.anchor-variants",),
    "routing": ("feast.routing",),
    "substrate": ("substrate.supernet",),
    "nas-family": ("candidates.family",),
}
#: Keys added after runs were kept, with the value those runs behaved as.
LATER_KEYS: dict[str, Any] = {
    "tensorboard": False,
    "max-weight-share": 1.0,
    "budget-floor": 0.0,
    "fleet.file": "default",
    "fleet.policy": "wait-for-all",
    "fleet.deadline": 0.0,
    "fleet.over-commit": 1.3,
    "fleet.clock": "virtual",
}


def current_config(saved: Mapping[str, Any]) -> RunConfig:
    """A config.json in today's keys (ConfigError if today's checks refuse it); other methods'
    sections, which never shaped the run, at today's defaults."""
    renamed = dict(LATER_KEYS)
    for key, value in saved.items():
        for new in SECTIONED_KEYS.get(key, (key,)):
            renamed[new] = value
    return parse_saved_config(renamed, fused_run_config(REPO, {}))


def point_with_interval(point: Mapping[str, Any], test_images: int) -> dict[str, Any]:
    """An operating point (summary.json's or a variants.csv row) with its interval after its
    accuracy and the images it was measured on last, as today's points are written."""
    if LOW in point:
        return dict(point)
    interval = wilson_interval(float(point["accuracy"]), test_images)
    updated: dict[str, Any] = {}
    for key, value in point.items():
        updated[key] = value
        if key == "accuracy":
            updated[LOW], updated[HIGH] = interval
    return updated | {"images": point.get("images", test_images)}


def summary_with_intervals(summary: Mapping[str, Any], test_images: int) -> dict[str, Any]:
    """summary.json with ``test_images``, its accuracies' intervals and its points'."""
    updated = dict(summary) | summary_intervals(summary, test_images)
    if "variants" in summary:
        updated["variants"] = [point_with_interval(p, test_images) for p in summary["variants"]]
    return updated


def variants_csv_with_intervals(text: str, test_images: int) -> str:
    """variants.csv with every point's interval and image count."""
    rows = [point_with_interval(row, test_images) for row in csv.DictReader(io.StringIO(text))]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _json_text(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, indent=2, sort_keys=True) + "\n"


def migrate(run_dir: Path, write: bool) -> list[str]:
    """The files of one run folder that are (or would be) rewritten."""
    changed = []
    saved = read_json(run_dir / CONFIG_FILE)
    config = current_config(saved)
    if saved != json.loads(json.dumps(config.as_saved_config())):
        changed.append(CONFIG_FILE)
        if write:
            replace_text(run_dir / CONFIG_FILE, _json_text(config.as_saved_config()))
    summary = read_json(run_dir / SUMMARY_FILE)
    variants_path = run_dir / VARIANTS_FILE
    variants_text = variants_path.read_text() if variants_path.is_file() else None
    header = (variants_text or "").partition("\n")[0]
    needs_points = bool(header) and LOW not in header
    if "test_images" in summary and not needs_points:
        return changed
    test_images = len(server_set(data_layout(config), "test").labels)
    if "test_images" not in summary:
        changed.append(SUMMARY_FILE)
        if write:
            replace_text(
                run_dir / SUMMARY_FILE, _json_text(summary_with_intervals(summary, test_images))
            )
    if needs_points:
        changed.append(VARIANTS_FILE)
        if write:
            replace_text(variants_path, variants_csv_with_intervals(variants_text, test_images))
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run folders, or folders above them")
    parser.add_argument(
        "--check", action="store_true", help="report what would change, write nothing"
    )
    args = parser.parse_args(argv)
    runs = sorted(
        {summary.parent for folder in args.folders for summary in folder.rglob(SUMMARY_FILE)}
    )
    if not runs:
        print(f"no run folder (one with {SUMMARY_FILE}) under {', '.join(map(str, args.folders))}")
        return 1
    failed = 0
    for run_dir in runs:
        try:
            changed = migrate(run_dir, write=not args.check)
        except (ConfigError, ValueError, OSError, KeyError, TypeError) as err:
            print(f"{run_dir}: not migrated: {err}")
            failed += 1
            continue
        verb = "would rewrite" if args.check else "rewrote"
        print(f"{run_dir}: {f'{verb} ' + ', '.join(changed) if changed else 'up to date'}")
    print(
        f"{len(runs) - failed} of {len(runs)} run folders up to date"
        + (" after this" if args.check else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
