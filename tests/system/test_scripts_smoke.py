"""Every script in benchmarks/ and scripts/ runs on a clean clone: each one's smallest form, as
its docstring names it, to the end (exit 0 and its last table or line printed).

The measurements themselves take minutes to hours (a GPU's rounds, the GA's cache build, a
50-round churn soak, an emulated board); their smallest forms check what breaks them at once:
the run configs they write (a method section is a TOML table Flower must parse), their
arguments, and every code path up to the printed figures. The deployment scripts' own checks
are in test_deployment_scripts.py, test_deployment_*.py and test_arm64_node_script.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from processes import REPO_DIR

#: (script and arguments, text its output ends with, seconds it may take)
SMOKES = [
    (["benchmarks/gpu_check.py", "--smoke"], "| Ray nodes |", 300),
    (["benchmarks/quickstart_breakdown.py", "--smoke"], "non-training share", 300),
    (
        ["benchmarks/deployment_overhead.py", "--workload", "digits", "--rounds", "1"],
        "deployment/simulation round time",
        300,
    ),
    (["benchmarks/cpu_sensitivity.py", "--smoke"], "repetitions, settings alternating", 300),
    (["benchmarks/model_space_aggregation.py", "--smoke"], "routed/dense time ratio", 300),
    (["benchmarks/model_space_training_step.py", "--smoke"], "Inference", 300),
    (["benchmarks/model_space_ga.py", "--smoke", "--workers", "1"], "unique architectures", 300),
    (
        [
            "scripts/capacity_probe.py",
            *("--run-config", "conf/quickstart.toml", "--variants", "0", "--epochs", "1"),
        ],
        "epoch  1",
        300,
    ),
    (["scripts/results_digest.py", "{tmp}/digest", "fedavg"], "fedavg", 300),
    (
        ["scripts/migrate_run_folders.py", "--check", "docs/results/runs"],
        "run folders up to date after this",
        300,
    ),
    (["scripts/churn_soak.py", "--smoke", "--work", "{tmp}/soak"], "test accuracy:", 600),
]


def _id(smoke: tuple[list[str], str, int]) -> str:
    return Path(smoke[0][0]).stem


@pytest.mark.parametrize(("args", "ends_with", "timeout"), SMOKES, ids=[_id(s) for s in SMOKES])
def test_each_script_runs_its_smallest_form(
    tmp_path: Path, args: list[str], ends_with: str, timeout: int
) -> None:
    command = [sys.executable, *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(
        command,
        cwd=REPO_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(args)} exited {result.returncode}:\n{output[-4000:]}"
    assert ends_with in result.stdout, output[-4000:]


def test_the_arm64_rehearsal_checks_its_config_and_arguments_without_qemu(tmp_path: Path) -> None:
    """`arm64-node.sh rehearse --check`: the run config it writes is read back by Flower's and
    fedapp's parsers, certificates and node keys are made, and every start script accepts its
    arguments (--check); nothing needs root, qemu or the emulated root."""
    if shutil.which("openssl") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("needs openssl and ssh-keygen (Debian/Ubuntu packages openssl, openssh-client)")
    env = dict(
        os.environ,
        FEDAPP_REHEARSAL_DIR=str(tmp_path / "rehearsal"),
        FEDAPP_ARM64_ROOT=str(tmp_path / "no-root"),
        FEDAPP_VENV=str(Path(sys.executable).parents[1]),
    )
    result = subprocess.run(
        [str(REPO_DIR / "scripts" / "deploy" / "arm64-node.sh"), "rehearse", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check passed" in result.stderr
    assert "[fedkd-nas]" in (tmp_path / "rehearsal" / "run.toml").read_text()
    commands = result.stdout.splitlines()
    assert commands[0].startswith("flower-superlink --host 127.0.0.1 --port 9092 ")
    assert [c.split("--node-config ")[1].split(" --")[0] for c in commands[1:]] == [
        "partition-id=0 num-partitions=3 budget=1500000",
        "partition-id=1 num-partitions=3 budget=500000",
        "partition-id=2 num-partitions=3 budget=150000",
    ]
    assert not (tmp_path / "no-root").exists()
