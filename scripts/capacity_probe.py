"""How far apart a run's cached operating points can be at all: each chosen variant trained alone,
centrally, on the clients' whole pool (plain cross-entropy, the run's optimiser and batch size,
cosine decay over the probe), scored after each epoch on the training images that neither the
server nor any client holds (a run with client-pool-size leaves them), else on validation.

A federated frontier cannot rise more than its variants' capacities differ under a comparable
amount of training, so this separates "the model space is too flat here" from "federated
co-training flattens it". It never looks at the test split.

    python scripts/capacity_probe.py --run-config conf/feast-fmnist.toml --variants 0,9 --epochs 6
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path

import numpy as np
import torch

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.intervals import wilson_interval
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.random_streams import Stream, stream_seed
from fedapp.run.config import fused_run_config, parse_run_config
from fedapp.run.context import data_layout, run_context
from fedapp.run.feast_space import model_space
from fedapp.run.federated_data import population, server_set
from fedapp.tools.launcher import APP_DIR
from fedapp.training.loops import (
    eval_loader,
    evaluate,
    seed_local_work,
    sgd,
    train_loader,
    train_supervised,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", required=True, help="a preset of a FEAST-space run")
    parser.add_argument("--variants", default="0,9", help="cache indices, comma-separated")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="", help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    values = tomllib.loads(Path(args.run_config).read_text())
    cfg = parse_run_config(fused_run_config(APP_DIR, values))
    pop = population(data_layout(cfg))
    space = model_space(run_context(cfg).feast_space, pop.info)
    everything = pop.dataset.train
    train = ImageArrays(
        everything.images[pop.splits.clients], everything.labels[pop.splits.clients]
    )
    held = [getattr(pop.splits, name) for name in ("calibration", "validation", "public", "test")]
    unused = np.setdiff1d(
        np.arange(len(everything.labels)), np.concatenate([*held, pop.splits.clients])
    )
    if unused.size:
        scored = ImageArrays(everything.images[unused], everything.labels[unused])
        print(f"scoring on the {unused.size} training images no one holds", flush=True)
    else:
        scored = server_set(data_layout(cfg), "validation")
        print(f"scoring on the {len(scored.labels)} validation images", flush=True)
    validation = eval_loader(scored, pop.info, 256)
    rows = []
    for index in (int(i) for i in args.variants.split(",")):
        variant = space.cache.variants[index]
        supernet = ElasticResNet(space.config, seed=stream_seed(cfg.seed, Stream.INITIAL_WEIGHTS))
        model = supernet.subnet(variant.arch)
        optimizer = sgd(model, cfg.learning_rate, cfg.momentum, cfg.weight_decay)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs)
        started = time.perf_counter()
        for epoch in range(1, args.epochs + 1):
            generator = seed_local_work(cfg.seed, Stream.LOCAL_TRAINING, epoch, index)
            loader = train_loader(train, pop.info, cfg.batch_size, generator)
            train_supervised(model, loader, optimizer, 1, torch.device("cpu"))
            schedule.step()
            result = evaluate(model, validation, torch.device("cpu"))
            low, high = wilson_interval(result["accuracy"], len(scored.labels))
            row = {
                "variant": index,
                "macs": variant.macs,
                "params": variant.params,
                "epoch": epoch,
                "held_out_accuracy": result["accuracy"],
                "ci95_low": low,
                "ci95_high": high,
                "seconds": time.perf_counter() - started,
            }
            rows.append(row)
            print(
                f"variant {index} | {variant.macs / 1e6:6.2f}M MACs | epoch {epoch:2d} | "
                f"held out {100 * row['held_out_accuracy']:.2f}% "
                f"[{100 * low:.2f}, {100 * high:.2f}] | {row['seconds']:.0f} s",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
