"""What hctool puts on a child's PYTHONPATH: sitecustomize.py only (no module
of ours shadows the user's), and faults that cannot be installed stop the
process instead of silently running a scenario without them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hctool.supervise.procs import AGENT_SITE_DIR, inject_env

pytestmark = pytest.mark.timeout(60)


def test_only_sitecustomize_is_on_the_injected_path():
    assert sorted(p.name for p in AGENT_SITE_DIR.iterdir() if p.name != "__pycache__") == ["sitecustomize.py"]


def test_a_users_faults_module_is_not_shadowed(tmp_path):
    user = tmp_path / "userlib"
    user.mkdir()
    (user / "faults.py").write_text("WHOSE = 'user'\n")
    env = inject_env(dict(os.environ, PYTHONPATH=str(user)), FAULTS="h2d-sleep:rank=1,ms=5")
    proc = subprocess.run(
        [sys.executable, "-c", "import faults; print(faults.WHOSE)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "user"
    assert proc.stderr == ""  # our faults installed quietly, from hctool.agent.faults


def test_faults_that_cannot_be_installed_stop_the_process(tmp_path):
    env = inject_env(dict(os.environ), FAULTS="no-such-fault:ms=5")
    proc = subprocess.run(
        [sys.executable, "-c", "print('ran without its faults')"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "ran without" not in proc.stdout
    assert "hctool: installing faults" in proc.stderr and "no-such-fault" in proc.stderr
