"""`fedapp compare` as users run it, with the real `flwr run` (every process it starts is
stopped): a rerun into the same folder keeps finished runs, resumes an interrupted one and writes
the table of both."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from local_grid import PowerCut, crash_in_round, run_local
from processes import BIN_DIR, flower_env, pids_mentioning

from fedapp.evaluation.intervals import format_accuracy
from fedapp.tools import cli
from fedapp.tools.compare import TABLE_FILE, load_comparison, placed_run_config, run_dir_of


def _compare_smoke_digits(tmp_path: Path, out: Path) -> subprocess.CompletedProcess:
    """The real `fedapp compare smoke-digits` into ``out``; it must succeed and leave no process."""
    env = flower_env(tmp_path / "home", OMP_NUM_THREADS="1")
    try:
        result = subprocess.run(
            [str(BIN_DIR / "fedapp"), "compare", "smoke-digits", "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:  # compare stops the SuperLinks it started; make sure of it
        leftovers = pids_mentioning(str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not leftovers
    return result


def test_rerun_keeps_finished_runs_and_resumes_interrupted_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fedapp compare` again into the same folder: a finished strategy is kept as it is, an
    interrupted one (checkpoint, no summary) continues from its last completed round through the
    real `flwr run`, and a changed run config stops the command before anything runs."""
    out = tmp_path / "out"
    comparison = load_comparison("smoke-digits")  # fedavg and feast, 2 rounds on 4 clients
    with pytest.raises(PowerCut):
        run_local(
            placed_run_config(comparison, "fedavg", out), 4, reply_hooks={0: crash_in_round(2)}
        )
    run_local(placed_run_config(comparison, "feast", out), 4)
    fedavg_dir, feast_dir = run_dir_of(out, "fedavg"), run_dir_of(out, "feast")
    assert (fedavg_dir / "checkpoint.pt").exists() and not (fedavg_dir / "summary.json").exists()
    finished = (feast_dir / "summary.json").read_bytes()
    feast = json.loads(finished)
    assert feast["rounds"] == 2

    # another learning rate: both kept runs named with the key and both values, nothing run
    assert cli.main(["compare", "smoke-digits", "--out", str(out), "--set", "learning-rate=0.2"])
    error = capsys.readouterr().err
    for strategy in ("fedavg", "feast"):
        assert f"{strategy}: {run_dir_of(out, strategy)} was run with another config" in error
    assert error.count("learning-rate = 0.05 there, 0.2 now") == 2
    assert not (out / "fedavg" / "flwr-run.log").exists()

    result = _compare_smoke_digits(tmp_path, out)
    assert "[1/2] fedavg: interrupted, resuming from its checkpoint" in result.stdout
    rows = list(csv.DictReader((out / TABLE_FILE).open()))
    assert [r["method"] for r in rows] == ["fedavg", "feast"]
    assert "| fedavg |" in result.stdout and "| feast |" in result.stdout
    accuracy = format_accuracy(feast["test_accuracy"], feast["test_accuracy_ci95"])
    assert f"[2/2] feast: already finished ({accuracy}), kept\n" in result.stdout
    assert (feast_dir / "summary.json").read_bytes() == finished
    assert not (out / "feast" / "flwr-run.log").exists()  # feast was not started again
    resumed = json.loads((fedavg_dir / "summary.json").read_text())
    assert (resumed["resumed_from_round"], resumed["rounds"]) == (1, 2)
    metrics = (fedavg_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in metrics] == [1, 2]  # none lost or repeated

    # once more: both finished, their configs (one written through flwr run) match; nothing runs
    assert cli.main(["compare", "smoke-digits", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[1/2] fedavg: already finished (" in printed and "| fedavg |" in printed
    assert json.loads((fedavg_dir / "summary.json").read_text()) == resumed
