"""Real runs meet torn files and a busy folder: a torn summary, metrics line, checkpoint, model or
config met on resume or by ``load_run`` is an error naming the file, before anything in the
folder changes; a second run into a folder another process is writing is refused at once; a
run-name that leaves out-dir is refused.

One FedAvg run on the digits cut in round 2 of 2 (as in test_resume) and one finished run serve
every test; each test spoils its own copy.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from digits_runs import SMALL_FEDAVG
from local_grid import PowerCut, crash_in_round, preset_overrides, run_config, run_local
from processes import read_rounds

from fedapp.evaluation.results import LOCK_FILE, RunFileError
from fedapp.results import load_run
from fedapp.run.config import ConfigError
from fedapp.tools import cli
from fedapp.tools.launcher import stop

ROUNDS, NODES = 2, SMALL_FEDAVG["num_clients"]


def _config(out: Path, name: str, **extra: Any) -> dict[str, Any]:
    return run_config(
        **preset_overrides("fedavg-digits")
        | SMALL_FEDAVG
        | {"num_server_rounds": ROUNDS, "out_dir": str(out), "run_name": name}
        | extra
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``cut`` (a run cut in round 2, resumable after round 1) and ``done``."""
    out = tmp_path_factory.mktemp("runs")
    with pytest.raises(PowerCut):
        hooks = dict.fromkeys(range(NODES), crash_in_round(2))
        run_local(_config(out, "cut"), num_nodes=NODES, reply_hooks=hooks)
    run_local(_config(out, "done"), num_nodes=NODES)
    return out


def _copy(runs: Path, tmp_path: Path, name: str) -> Path:
    shutil.copytree(runs / name, tmp_path / name)
    return tmp_path / name


def _hashes(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _resume(tmp_path: Path) -> dict[str, Any]:
    return run_local(_config(tmp_path, "cut", resume=True), num_nodes=NODES)[0]


def _cut_short(path: Path) -> None:
    """Half of the file, cut inside a line (as a crash mid-write would leave it)."""
    half = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(half[:-1] if half.endswith(b"\n") else half)


def _without_accounts(path: Path) -> None:
    """A whole checkpoint that lacks what this fedapp writes into every one."""
    saved = torch.load(path, weights_only=True)
    del saved["extra"]["accounts"]
    torch.save(saved, path)


@pytest.mark.parametrize(
    ("name", "spoil"),
    [
        ("metrics.jsonl", lambda p: p.write_text('{"round": 1, "clients-acc\n' + p.read_text())),
        ("checkpoint.pt", _cut_short),
        ("checkpoint.pt", _without_accounts),
        ("model_best.pt", _cut_short),
        ("config.json", _cut_short),
    ],
)
def test_a_torn_file_met_on_resume_is_an_error_naming_it_and_nothing_changes(
    runs: Path, tmp_path: Path, name: str, spoil: Any
) -> None:
    run_dir = _copy(runs, tmp_path, "cut")
    spoil(run_dir / name)
    before = _hashes(run_dir)
    with pytest.raises(RunFileError) as refused:
        _resume(tmp_path)
    assert f"{run_dir / name} is torn or corrupt" in str(refused.value)
    assert "another 'run-name'" in str(refused.value)  # says what to do
    assert _hashes(run_dir) == before


def test_a_metrics_line_torn_by_a_crash_is_dropped_and_the_run_resumes(
    runs: Path, tmp_path: Path
) -> None:
    """A crash while round 2's row was appended: that round has no checkpoint, so its torn
    row goes and round 2 runs again."""
    run_dir = _copy(runs, tmp_path, "cut")
    row = json.dumps(read_rounds(run_dir)[0] | {"round": 2}, sort_keys=True)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(row[: len(row) // 2])
    summary = _resume(tmp_path)
    assert summary["resumed_from_round"] == 1
    assert [r["round"] for r in read_rounds(run_dir)] == [1, 2]


@pytest.mark.parametrize(
    ("name", "spoil"),
    [
        ("summary.json", _cut_short),
        ("metrics.jsonl", _cut_short),
        ("metrics.jsonl", lambda p: p.write_text(p.read_text().replace('"round"', '"ro', 1))),
        ("communication.csv", _cut_short),
        ("labels.csv", _cut_short),
    ],
)
def test_a_torn_file_of_a_finished_run_is_an_error_naming_it_in_load_run_and_show(
    runs: Path, tmp_path: Path, name: str, spoil: Any, capsys: pytest.CaptureFixture
) -> None:
    run_dir = _copy(runs, tmp_path, "done")
    load_run(run_dir)  # whole, it loads
    spoil(run_dir / name)
    with pytest.raises(RunFileError, match=f"{run_dir / name} is torn or corrupt"):
        load_run(run_dir)
    assert cli.main(["show", str(run_dir)]) == cli.EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.startswith(f"fedapp: error: {run_dir / name} is torn or corrupt")
    assert "Traceback" not in error


_HOLD = """
import sys, time
from pathlib import Path
from fedapp.evaluation.results import run_folder_lock
with run_folder_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_run_into_a_folder_being_written_is_refused_at_once(
    runs: Path, tmp_path: Path
) -> None:
    """Another process holds the folder as a running ServerApp does; the resume is refused
    before anything changes, and runs at once when that process is killed: the OS lock dies
    with it."""
    run_dir = _copy(runs, tmp_path, "cut")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = _hashes(run_dir)
        started = time.monotonic()
        with pytest.raises(RunFileError) as refused:
            _resume(tmp_path)
        assert time.monotonic() - started < 5  # at once: no node was waited for
        message = str(refused.value)
        assert f"{run_dir} is being written by another run (process {holder.pid} " in message
        assert "nothing in the folder was changed" in message
        assert _hashes(run_dir) == before
        with pytest.raises(RunFileError, match="being written by another run"):
            run_local(_config(tmp_path, "cut"), num_nodes=NODES)  # nor a fresh start
        assert _hashes(run_dir) == before
    finally:
        stop(holder.pid, grace=0, group=True)
        holder.wait(timeout=10)
    assert _resume(tmp_path)["resumed_from_round"] == 1
    assert (run_dir / LOCK_FILE).read_text().strip().isdigit()  # the last writer's PID


@pytest.mark.parametrize("name", ["../escaped", "/tmp/fedapp-escaped-run"])
def test_a_run_name_that_leaves_out_dir_is_refused_before_anything_is_written(
    tmp_path: Path, name: str
) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=f"'run-name' = {name!r} is not allowed"):
        run_local(_config(out, name), num_nodes=NODES)
    assert not out.exists() and not (tmp_path / "escaped").exists()
    assert not Path("/tmp/fedapp-escaped-run").exists()
