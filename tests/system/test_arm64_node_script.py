"""The emulated board's scripts refuse what they cannot do before they start anything.

Building the arm64 root and the rehearsal take most of an hour under qemu-user, so they are run by
hand (docs/deployment.md shows their output); these checks need neither the root nor qemu.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from processes import DEPLOY_SCRIPTS


def _run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEPLOY_SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_without_a_command_it_prints_its_usage() -> None:
    result = _run("arm64-node.sh")
    assert result.returncode == 2
    for command in ("build", "node", "run", "rehearse"):
        assert f"arm64-node.sh {command}" in result.stdout


def test_an_unknown_command_is_named() -> None:
    result = _run("arm64-node.sh", "flash")
    assert result.returncode == 1
    assert "unknown command flash (build, node, run, rehearse)" in result.stderr


def test_the_rehearsal_needs_a_root_whose_install_can_cut_a_shard(tmp_path: Path) -> None:
    """A root with the base install only (a board with data-path) cannot join a run whose nodes
    cut a seeded shard of mnist-5k: the rehearsal says how to add the data extra."""
    root = tmp_path / "root"
    (root / "opt" / "fedapp").mkdir(parents=True)
    (root / "opt" / "fedapp" / ".installed").write_text("0123456789abcdef board\n")
    env = {"PATH": "/usr/bin:/bin", "FEDAPP_ARM64_ROOT": str(root), "HOME": str(tmp_path)}
    env["FEDAPP_VENV"] = str(Path(DEPLOY_SCRIPTS).parents[1] / ".venv")
    result = _run("rehearse-arm64.sh", env=env)
    assert result.returncode == 1
    assert "lacks the data extra" in result.stderr
    assert "FEDAPP_ARM64_EXTRAS=data,board" in result.stderr
