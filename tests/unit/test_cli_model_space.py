"""The ``fedapp`` model-space commands reproduce the paper's counts; bad input exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedapp.tools.cli import main

REF = "feast-cifar100-reference"


def _json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_supernet_reports_parameters_and_cache_range(capsys) -> None:
    out = _json(capsys, "supernet", "--supernet", "feast-cifar100", "--cache", REF)
    assert out["params"] == 55_682_916 and out["classes"] == 100
    assert (out["cache"]["min_macs"], out["cache"]["max_macs"]) == (24_967_328, 595_735_872)
    assert main(["supernet", "--cache", REF]) == 0
    assert "55,682,916" in capsys.readouterr().out


def test_macs_of_one_architecture(capsys) -> None:
    arch = "d=3,7,6,7 e=0.18,0.18,0.1,0.1 w=2,0,0,0,0"
    out = _json(capsys, "macs", "--arch", arch)
    assert out["macs"] == 24_967_328 and out["arch"]["w"] == [2, 0, 0, 0, 0]
    ten = _json(capsys, "macs", "--arch", arch, "--classes", "10")
    assert (ten["macs"], ten["params"]) == (24_957_968, 327_522)


@pytest.mark.parametrize(
    ("budget", "millions", "affordable"),
    [
        ("24967328", 0.50, 1),
        ("49587360", 2.41, 4),
        ("228846432", 10.02, 23),
        ("408295584", 20.61, 39),
        ("595.735872M", 35.60, 56),
    ],
)
def test_route_reproduces_table_9(capsys, budget, millions, affordable) -> None:
    out = _json(capsys, "route", "--cache", REF, "--budget", budget)
    assert round(out["params"] / 1e6, 2) == millions and out["affordable"] == affordable


def test_a_cache_is_counted_on_the_supernet_it_names(capsys) -> None:
    out = _json(capsys, "route", "--cache", "feast-small-digits", "--budget", "1M")
    assert out["supernet"] == "feast-small" and out["affordable"] >= 1
    shown = _json(capsys, "cache", "show", REF, "--classes", "10")
    assert (shown["classes"], shown["min_macs"]) == (10, 24_957_968)


def test_route_envelope_of_the_whole_cache(capsys) -> None:
    out = _json(capsys, "route", "--cache", REF, "--budget", "1.5G")
    assert out["envelope"]["d"] == [8, 8, 8, 8] and out["envelope"]["w"] == [9, 6, 6, 7, 7]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["route", "--cache", REF, "--budget", "20M"], "below the smallest cached variant"),
        (["macs", "--arch", "d=1,2,3"], "lacks e, w"),
        (["macs", "--arch", "d=9,0,0,0 e=0.1,0.1,0.1,0.1 w=0,0,0,0,0"], "depths"),
        (["supernet", "--supernet", "nope"], "no supernet 'nope'"),
        (["cache", "show", "nope"], "no variant cache 'nope'"),
        (["cache", "import", "missing.csv", "--out", "x.yaml"], "no such file"),
    ],
)
def test_bad_input_is_a_one_line_error_with_exit_code_2(capsys, argv, message) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedapp: error:") and message in err and "\n" not in err


def test_cache_build_show_and_import(tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "digits.yaml"
    built = _json(
        capsys,
        "cache",
        "build",
        "--supernet",
        "feast-small",
        "--image-size",
        "8",
        "--segment",
        "0.3e6:3e6:3:0.31:5",
        "--population",
        "24",
        "--generations",
        "5",
        "--out",
        str(out_file),
    )
    assert built["variants"] >= 1 and built["source"]["segments"][0]["seed"] == 5
    shown = _json(capsys, "cache", "show", str(out_file))
    assert shown["variants"] == built["variants"] and shown["rows"][0]["index"] == 0
    moved = _json(
        capsys,
        "cache",
        "import",
        str(out_file),
        "--supernet",
        "feast-small",
        "--out",
        str(tmp_path / "mnist.yaml"),
    )
    assert moved["variants"] == built["variants"] and moved["min_macs"] > built["min_macs"]


def test_console_entry_point_runs_as_a_module() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedapp.tools.cli",
            "macs",
            "--arch",
            "d=0,0,0,0 e=0.1,0.1,0.1,0.1 w=0,0,0,0,0",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["params"] > 0
