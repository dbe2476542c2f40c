"""Progress on stderr only when stderr is a terminal: a pseudo-terminal sees the
progress line; a pipe sees exactly the lines it always saw; -q silences both."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET = ["hctool", "engine"]  # enough files (~200) that the progress line is drawn


def _lint(*flags: str, tty: bool) -> tuple[int, bytes, bytes]:
    """`hctool [flags] lint hctool engine` (text output), stderr on a pty or a pipe: (exit code, stdout, stderr)."""
    cmd = [sys.executable, "-m", "hctool", *flags, "lint", *TARGET, "--jobs", "1", "--no-cache"]  # real work to show
    env = dict(os.environ, COLUMNS="120", LINES="40", TERM="xterm")
    env.pop("HCTOOL_DEBUG", None)
    if not tty:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, timeout=240)
        return proc.returncode, proc.stdout, proc.stderr
    master, slave = os.openpty()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    err = b""
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # EIO: the child closed its side
                    break
                if not chunk:
                    break
                err += chunk
            elif proc.poll() is not None:
                break
        out = proc.stdout.read()
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, out, err


def test_a_terminal_sees_progress():
    code, out, err = _lint(tty=True)
    assert code in (0, 1), err[-2000:]
    assert b"lint" in err and b"files summarized" in err and "━".encode() in err, err[-2000:]
    assert b"findings in" in out and b"\x1b" not in out  # stdout: the same plain data


def test_no_terminal_no_progress_and_the_same_lines():
    code, out, err = _lint(tty=False)
    assert code in (0, 1)
    lines = err.decode().splitlines()
    assert len(lines) == 2 and lines[0].startswith("pass 1: summarizing ") and lines[1].startswith("pass 2: checking ")
    assert b"\x1b" not in err and "━".encode() not in err
    _, out_tty, _ = _lint(tty=True)
    timing = re.compile(rb"[0-9.]+s\)")
    assert timing.sub(b"", out) == timing.sub(b"", out_tty)  # the data does not depend on where stderr goes


def test_quiet_silences_progress_and_diagnostics():
    _, _, err = _lint("-q", tty=True)
    assert err == b""
    _, _, err = _lint("-q", tty=False)
    assert err == b""
