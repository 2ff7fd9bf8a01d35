"""What `fedapp compare` shows while a method runs in another process: read from the run folder."""

from __future__ import annotations

import io
import json
from pathlib import Path

from fedapp.evaluation.results import METRICS_FILE
from fedapp.tools.run_progress import RunProgress, rounds_done


def _finish_rounds(run_dir: Path, rounds: range) -> None:
    with (run_dir / METRICS_FILE).open("a") as f:
        for r in rounds:
            f.write(json.dumps({"round": r, "train-loss": 1.0 / r}) + "\n")


def test_rounds_are_counted_from_the_metrics_file(tmp_path) -> None:
    assert rounds_done(tmp_path) == 0  # before the first round, no file
    _finish_rounds(tmp_path, range(1, 4))
    assert rounds_done(tmp_path) == 3


def test_a_log_gets_the_round_and_the_time_left_then_the_final_evaluation(tmp_path) -> None:
    _finish_rounds(tmp_path, range(1, 3))  # a resumed run: two rounds done before
    out = io.StringIO()
    progress = RunProgress(tmp_path, 6, out=out, quiet_seconds=0.0)
    progress.update()
    _finish_rounds(tmp_path, range(3, 5))
    progress.update()
    _finish_rounds(tmp_path, range(5, 7))
    progress.update()
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("    round 2/6 |") and "left" not in lines[0]
    assert lines[1].startswith("    round 4/6 |") and lines[1].endswith("left")
    assert lines[2].startswith("    rounds done, final evaluation |")


def test_a_log_is_not_flooded_between_signs_of_life(tmp_path) -> None:
    out = io.StringIO()
    progress = RunProgress(tmp_path, 100, out=out, quiet_seconds=3600.0)
    for r in range(1, 6):
        _finish_rounds(tmp_path, range(r, r + 1))
        progress.update()
    assert out.getvalue() == ""
    assert "round 5/100" in progress.status()


def test_a_fresh_run_over_an_unfinished_ones_metrics_restarts_the_estimate(tmp_path) -> None:
    _finish_rounds(tmp_path, range(1, 8))  # left by an interrupted run without a checkpoint
    progress = RunProgress(tmp_path, 100, out=io.StringIO(), quiet_seconds=3600.0)
    (tmp_path / METRICS_FILE).unlink()  # the new run starts its own file
    _finish_rounds(tmp_path, range(1, 3))
    progress.update()
    status = progress.status()
    assert status.startswith("round 2/100 |") and "left" in status and "-" not in status
