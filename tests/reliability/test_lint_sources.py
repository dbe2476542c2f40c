"""`hctool lint` on what a folder may hold under a *.py name: a FIFO (before: lint hung forever),
a link to /dev/zero (before: memory grew ~1.2 GB/s), a link out of the tree, a huge file, and a
FIFO named on the command line (before: exit 0, no message). Each is one `Error:` line naming
the file, exit 2, and the good files beside it are still analyzed. Real files, the real CLI."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.reliability.helpers import REPO, child_env

GOOD = "import torch.distributed as dist\n\ndef f(x, rank):\n    if rank == 0:\n        dist.all_reduce(x)\n"


def _lint(*args: str) -> subprocess.CompletedProcess:
    def cap_memory():  # the /dev/zero case must not take the box's memory if a read is unbounded
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(
        [sys.executable, "-m", "hctool", "lint", "--format", "json", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=cap_memory,
    )


def _errors(done: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in done.stderr.splitlines() if ln.startswith("Error:")]


def test_hostile_entries_in_a_folder_are_one_error_each(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.py").write_text(GOOD)
    os.mkfifo(src / "fifo.py")
    (src / "zero.py").symlink_to("/dev/zero")
    outside = tmp_path / "outside.py"
    outside.write_text(GOOD)
    (src / "away.py").symlink_to(outside)
    (src / "huge.py").write_bytes(b"# padding\n" * (1_700_000))  # 17 MB
    done = _lint(str(src))
    assert done.returncode == 2, done.stderr
    errors = _errors(done)
    assert len(errors) == 4, done.stderr
    text = "\n".join(errors)
    assert "fifo.py:1: cannot read: not a regular file" in text
    assert "zero.py:1: cannot read: a symbolic link" in text and "away.py:1: cannot read: a symbolic link" in text
    assert "huge.py:1: cannot read: larger than 16 MiB" in text
    assert '"HC10' in done.stdout and "good.py" in done.stdout  # the good file's finding is still there


def test_a_fifo_named_on_the_command_line_is_an_error(tmp_path: Path):
    os.mkfifo(tmp_path / "named.py")
    done = _lint(str(tmp_path / "named.py"))
    assert done.returncode == 2 and len(_errors(done)) == 1, done.stderr
    assert "named.py:1: cannot read: not a regular file" in _errors(done)[0]
