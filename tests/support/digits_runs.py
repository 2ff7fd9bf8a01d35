"""Run configs several test modules share: small runs on scikit-learn's real 8x8 digits, as
python_name overrides for ``local_grid.run_config``."""

from __future__ import annotations

from typing import Any

from local_grid import preset_overrides

#: FEAST on the small digits cache (nine variants, 0.20M to 4.20M MACs), budgets spanning them.
DIGITS_FEAST: dict[str, Any] = {
    "strategy": "feast",
    "dataset": "digits",
    "feast_space__variant_cache": "feast-small-digits",
    "budget_min": 2e5,
    "budget_max": 6e6,
    "allocation_cap": 4.2e6,
    "validation_size": 200,
    "test_size": 300,
    "calibration_size": 50,
    "batch_size": 16,
    "partitioner": "budget-dirichlet",
}

#: Over the fedavg-digits preset: four clients, three a round, one local epoch (a few seconds a
#: round).
SMALL_FEDAVG: dict[str, Any] = {"num_clients": 4, "fraction_train": 0.75, "local_epochs": 1}

#: FedKD-NAS's LeNet5 family on digits, three clients (budgets 82,918 / 10,000 / 300,000 MACs
#: with seed 42: x0.25 7,720, x0.5 19,260, x1.0 66,600, x2.0 245,520 MACs), all in every round.
DIGITS_FEDKD_NAS: dict[str, Any] = {
    "dataset": "digits",
    "candidates__family": "lenet5",
    "partitioner": "iid",
    "budget_min": 1e4,
    "budget_max": 3e5,
    "num_clients": 3,
    "fraction_train": 1.0,
    "local_epochs": 4,
    "batch_size": 16,
    "learning_rate": 0.02,
    "lr_schedule": "constant",
    "calibration_size": 0,
    "validation_size": 200,
    "public_size": 200,
    "test_size": 300,
    "fedkd_nas__teacher_epochs": 20,
    "eval_every": 1,
}

#: resnet18-small at 8x8 costs 23,861 / 72,312 / 273,576 / 1,029,424 / 4,103,264 MACs per width.
DIGITS_HETEROFL = {
    "strategy": "heterofl",
    "dataset": "digits",
    "budget_min": 3e4,
    "budget_max": 5e6,
    "allocation_cap": 4.2e6,
    "validation_size": 200,
    "test_size": 300,
    "calibration_size": 50,
    "batch_size": 16,
    "local_epochs": 1,
    "partitioner": "budget-dirichlet",
}


#: ScaleFL's four levels on the ResNet18 substrate.
DIGITS_SCALEFL = {
    "strategy": "scalefl",
    "dataset": "digits",
    "substrate__supernet": "resnet18-small",
    "num_clients": 4,
    "fraction_train": 1.0,
    "budget_min": 1e5,
    "budget_max": 6e6,  # seed 1: one client below level 1, one at level 2, two at level 4
    "allocation_cap": 4.2e6,
    "seed": 1,
    "validation_size": 200,
    "test_size": 300,
    "calibration_size": 50,
    "batch_size": 16,
    "local_epochs": 1,
}


#: FIARSE, three grid points.
DIGITS_FIARSE = {
    "strategy": "fiarse",
    "dataset": "digits",
    "partitioner": "iid",
    "budget_min": 2e5,
    "budget_max": 6e6,
    "validation_size": 100,
    "test_size": 200,
    "calibration_size": 32,
    "batch_size": 32,
    "local_epochs": 1,
    "fiarse__grid_points": 3,
    "eval_every": 2,
}


#: FedDF's LeNet5 prototypes, 20 distillation steps a round.
FEDDF_DIGITS = {
    "strategy": "feddf",
    "dataset": "digits",
    "candidates__family": "lenet5",
    "num_clients": 4,
    "fraction_train": 1.0,
    "num_server_rounds": 2,
    "partitioner": "iid",
    "budget_min": 1e4,
    "budget_max": 3e5,
    "calibration_size": 50,
    "validation_size": 200,
    "public_size": 200,
    "test_size": 300,
    "batch_size": 16,
    "local_epochs": 1,
    "learning_rate": 0.05,
    "lr_schedule": "constant",
    "eval_every": 1,
    "feddf__distill_steps": 20,
    "feddf__distill_eval_every": 5,
    "feddf__distill_patience": 10,
    "feddf__distill_batch_size": 32,
}


#: Ditto over the fedavg-digits preset.
DITTO_DIGITS = preset_overrides("fedavg-digits") | {
    "strategy": "ditto",
    "model": "lenet5-x0.5",
    "num_server_rounds": 2,
    "fraction_train": 1.0,
    "partitioner": "dirichlet",
    "dirichlet_alpha": 0.3,
}


#: digits, 3 IID clients whose budgets afford different LeNet5 widths (8x8: 7.7k-246k MACs):
#: the logit-exchange methods' runs (FedMD, FedDistill), all clients in every round.
LOGIT_EXCHANGE_DIGITS = {
    "dataset": "digits",
    "partitioner": "iid",
    "num_clients": 3,
    "fraction_train": 1.0,
    "validation_size": 200,
    "test_size": 300,
    "calibration_size": 0,
    "budget_min": 1e4,
    "budget_max": 3e5,
    "batch_size": 16,
}


#: FedMD with one epoch of each of its phases on a 200-image public set, 60 of them aligned.
FEDMD_PHASES: dict[str, Any] = {
    "strategy": "fedmd",
    "public_size": 200,
    "fedmd__alignment_size": 60,
    "fedmd__pretrain_public_epochs": 1,
    "fedmd__pretrain_private_epochs": 1,
    "fedmd__digest_epochs": 1,
    "fedmd__revisit_epochs": 1,
}


DIGITS_FEDDISTILL = LOGIT_EXCHANGE_DIGITS | {
    "strategy": "feddistill",
    "learning_rate": 0.05,
    "local_epochs": 1,
}
