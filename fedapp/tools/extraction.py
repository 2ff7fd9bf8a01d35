"""``fedapp extract``: serve a FEAST-space model at a MAC limit no cached variant matches.

Post-hoc extraction needs no retraining: the GA searches the run's supernet
under the limit, the winner's weights are cut from the trained supernet (``model_best.pt``, the
checkpoint the run's test used), its BN statistics are recalibrated on the run's calibration set,
and it is tested once on the run's test split, exactly as the cached variants were.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedapp.evaluation.intervals import HIGH, LOW, format_row
from fedapp.evaluation.operating_points import OperatingPoint, calibration_loader
from fedapp.evaluation.results import BEST_MODEL_FILE, CONFIG_FILE, RunRecorder, read_json
from fedapp.methods.common.strategy import point_evaluator
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.models.posthoc import extract_posthoc
from fedapp.run.config import APP_DIR, ConfigError, fused_run_config, parse_saved_config
from fedapp.run.context import run_context
from fedapp.run.feast_space import model_space
from fedapp.run.federated_data import server_set
from fedapp.wire.records import load_state

#: Methods whose global model is a FEAST supernet.
SUPERNET_METHODS = ("feast", "superfednas", "deepfednas")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a finished run's folder (<out-dir>/<run-name>)")
    parser.add_argument("--macs", type=float, required=True, help="MAC limit of the new variant")
    parser.add_argument("--seed", type=int, default=0, help="seed of the GA search")


def extract(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Search, extract, recalibrate and test; the variant's facts and a one-line summary."""
    run_dir: Path = args.run_dir.expanduser()
    for name in (CONFIG_FILE, BEST_MODEL_FILE):
        if not (run_dir / name).is_file():
            raise ConfigError(f"{run_dir}: no {name} (give the folder of a finished run)")
    cfg = parse_saved_config(read_json(run_dir / CONFIG_FILE), fused_run_config(APP_DIR, {}))
    if cfg.strategy not in SUPERNET_METHODS:
        raise ConfigError(
            f"{run_dir} is a {cfg.strategy!r} run; extraction needs a FEAST supernet "
            f"({', '.join(SUPERNET_METHODS)})"
        )
    run = run_context(cfg)
    info = run.info
    space = model_space(run.feast_space, info)
    smallest = space.cache.min_macs
    if args.macs < smallest:
        raise ConfigError(f"--macs {args.macs:,.0f} is below the smallest variant ({smallest:,})")
    supernet = ElasticResNet(space.config)
    load_state(supernet, RunRecorder.load_state(run_dir / BEST_MODEL_FILE))
    evaluator = point_evaluator(run)
    calibration = calibration_loader(evaluator.calibration, info, evaluator.batch_size)
    batches = (x.to(evaluator.device) for x, _ in calibration)
    found, subnet = extract_posthoc(supernet.to(evaluator.device), args.macs, batches, args.seed)
    point = OperatingPoint(-1, found.macs, found.params, lambda: subnet, recalibrate=False)
    row = evaluator.rows([point], server_set(run.data, "test"))[0]
    data = {
        "run_dir": str(run_dir),
        "mac_limit": args.macs,
        "arch": str(found.arch),
        "macs": found.macs,
        "params": found.params,
        "fitness": found.fitness,
        "test_accuracy": row["accuracy"],
        "test_accuracy_ci95": [row[LOW], row[HIGH]],
        "test_images": row["images"],
        "test_loss": row["loss"],
    }
    text = (
        f"extracted {found.arch}: {found.macs / 1e6:.2f}M MACs (limit {args.macs / 1e6:.2f}M), "
        f"{found.params / 1e6:.3f}M params, test accuracy {format_row(row)} "
        "(BN recalibrated, no retraining)"
    )
    return data, text
