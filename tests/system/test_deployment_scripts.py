"""The deployment scripts shut the doors by default and refuse bad values before starting
anything: the SuperLink listens on 127.0.0.1 unless told otherwise (and says what an open
address exposes), the CA's key is made outside the server's folder, and the SuperNode script
checks its node config. ``--check`` prints the Flower command a script would run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from processes import DEPLOY_SCRIPTS


def _run(script: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEPLOY_SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def test_the_superlink_listens_on_this_machine_only_unless_an_address_is_given() -> None:
    closed = _run("start-superlink.sh", "--insecure", "--check")
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout.startswith("flower-superlink --host 127.0.0.1 --port 9092 ")
    assert closed.stderr == ""
    opened = _run("start-superlink.sh", "--insecure", "--host", "0.0.0.0", "--check")
    assert opened.returncode == 0 and "--host 0.0.0.0" in opened.stdout
    assert "Control API" in opened.stderr and "without authentication" in opened.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "0"], "--budget 0: must be a positive, finite number of MACs"),
        (["--budget", "-5e6"], "--budget -5e6: not a MAC count"),
        (["--budget", "inf"], "--budget inf: not a MAC count"),
        (["--budget", "1e999"], "--budget 1e999: must be a positive, finite number"),
        (["--budget", "48 M"], "not a MAC count"),
        (["--partition-id", "2"], "--partition-id 2 is outside 0..1"),
        (["--partition-id", "one"], "--partition-id one: expected an integer 0..1"),
        (["--num-partitions", "0"], "--num-partitions 0: expected a positive integer"),
        (["--superlink", "192.168.1.10"], "expected HOST:PORT"),
        (["--port", "70000"], "--port 70000: expected a port number"),
        (["--data-path", "/no/such/file.npz"], "no data at /no/such/file.npz"),
        (["--budget"], "--budget needs a value"),
    ],
)
def test_the_supernode_script_names_a_bad_value_before_starting(
    args: list[str], message: str
) -> None:
    options = {"--superlink": "127.0.0.1:9092", "--partition-id": "0", "--num-partitions": "2"}
    last = args if len(args) == 1 else []  # an option without its value
    options.update(zip(args[::2], args[1::2], strict=False) if not last else [])
    given = [part for pair in options.items() for part in pair]
    result = _run("start-supernode.sh", "--insecure", *given, "--check", *last)
    assert result.returncode != 0
    assert message in result.stderr
    assert "flower-supernode" not in result.stdout


@pytest.mark.parametrize(
    ("budget", "node_config_budget"),
    [("48000000", "48000000"), ("4.8e7", "48000000"), ("48M", "48000000"), ("1.5G", "1500000000")],
)
def test_the_supernode_script_takes_budgets_as_fedapp_writes_them(
    budget: str, node_config_budget: str
) -> None:
    result = _run(
        "start-supernode.sh",
        "--insecure",
        "--superlink",
        "127.0.0.1:9092",
        "--partition-id",
        "1",
        "--num-partitions",
        "2",
        "--budget",
        budget,
        "--check",
    )
    assert result.returncode == 0, result.stderr
    node_config = f"partition-id=1 num-partitions=2 budget={node_config_budget}"
    assert f"--node-config {node_config} --insecure" in result.stdout


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_the_ca_key_is_made_outside_the_servers_folder(tmp_path: Path) -> None:
    made = _run("make-certs.sh", "certs", "IP:192.168.1.10", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (tmp_path / "certs").iterdir()) == [
        "ca.crt",
        "server.key",
        "server.pem",
    ]
    assert sorted(p.name for p in (tmp_path / "certs-ca").iterdir()) == ["ca.crt", "ca.key"]
    assert "certs-ca/ca.key" in made.stdout and "offline" in made.stdout
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", "certs/ca.crt", "certs/server.pem"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    beside = _run("make-certs.sh", "--ca-dir", "certs2", "certs2", cwd=tmp_path)
    assert beside.returncode == 2 and "must not be OUT_DIR" in beside.stderr
