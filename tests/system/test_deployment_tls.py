"""TLS and SuperNode authentication end to end on 127.0.0.1, with the deployment guide's scripts.

A TLS SuperLink with node authentication, two SuperNodes whose keys are registered, 2 rounds of
FedAvg on the embedded digits; a third SuperNode with a valid CA but an unregistered key must be
refused. Every process is stopped by PID, also on failure. With ``FEDAPP_DEVICE_VENV`` set, the
SuperNodes run from that venv (a device's base install, tests/support/processes.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from processes import (
    DEVICE_VENV,
    FLWR,
    Federation,
    flwr_run,
    managed_processes,
    preset_with,
    read_rounds,
    script,
)

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("ssh-keygen") is None,
    reason="needs openssl and ssh-keygen (Debian/Ubuntu packages openssl, openssh-client)",
)


def test_tls_superlink_admits_registered_nodes_only(tmp_path: Path) -> None:
    certs, keys, out = tmp_path / "certs", tmp_path / "keys", tmp_path / "out"
    with managed_processes(tmp_path) as procs:
        fed = Federation(procs, tmp_path)
        script("make-certs.sh", str(certs), env=fed.env, cwd=tmp_path)
        # the server's folder holds no CA key: that is made beside it, to be moved offline
        assert sorted(p.name for p in certs.iterdir()) == ["ca.crt", "server.key", "server.pem"]
        assert (tmp_path / "certs-ca" / "ca.key").is_file()
        for name in ("sn0", "sn1", "stranger"):
            script("make-node-key.sh", str(keys), name, env=fed.env, cwd=tmp_path)
        fed.connect(str(certs / "ca.crt"))
        fed.start_superlink("--certs", str(certs), "--node-auth")
        for name in ("sn0", "sn1"):
            registered = subprocess.run(
                [FLWR, "supernode", "register", str(keys / f"{name}.pub"), "deploy"],
                env=fed.env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert registered.returncode == 0, registered.stdout + registered.stderr
            assert "registered" in registered.stdout
        ca = str(certs / "ca.crt")
        for partition_id, name in enumerate(("sn0", "sn1")):
            fed.start_supernode(name, partition_id, 2, "--ca", ca, "--key", str(keys / name))
        stranger_log = fed.start_supernode(
            "stranger", 0, 2, "--ca", ca, "--key", str(keys / "stranger")
        )

        preset = preset_with(
            tmp_path,
            "fedavg-digits",
            {"num-clients": 2, "num-server-rounds": 1, "out-dir": str(out), "run-name": "tls"},
        )
        log = tmp_path / "flwr-run.log"
        result = flwr_run(["deploy", "--run-config", str(preset)], fed.env, log)
        assert result.returncode == 0, log.read_text()[-4000:]
        assert (out / "tls" / "summary.json").exists(), log.read_text()[-4000:]
        rows = read_rounds(out / "tls")
        assert [(r["round"], r["clients-accepted"]) for r in rows] == [(1, 2)]
        if DEVICE_VENV:  # the devices' Python was the device venv's (start-supernode.sh execs)
            cmdline = Path(f"/proc/{fed.procs.by_name['sn0'].pid}/cmdline").read_bytes()
            python = Path(os.fsdecode(cmdline.split(b"\0")[0]))
            assert python.parent == Path(DEVICE_VENV).expanduser().resolve() / "bin", python

        # the stranger had the right CA but an unregistered key: refused, and it gave up
        assert fed.procs.wait_exit("stranger", timeout=60) != 0, stranger_log.read_text()
    assert "Failed to activate SuperNode" in stranger_log.read_text()
