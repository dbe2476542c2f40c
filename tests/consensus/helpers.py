"""Running the corpus through the CLI as a user does, and locating call sites."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROGRAMS = Path(__file__).resolve().parent / "programs"


def site(program: str, marker: str) -> str:
    """ "prog.py:LINE" of the line tagged `# SITE:<marker>`."""
    lines = (PROGRAMS / program).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# SITE:{marker}")]
    assert len(hits) == 1, (program, marker, hits)
    return f"{program}:{hits[0]}"


def run_check(
    program: str,
    tmp_path: Path,
    *,
    nproc: int = 2,
    fix: bool = False,
    extra: list[str] | None = None,
    wrapper: list[str] | None = None,
    timeout: float = 90,
    args: list[str] | None = None,
) -> tuple[int, dict, str]:
    """`hctool check-consensus run --json` in a real subprocess: (exit code, report, stderr)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))  # a program's temporary files stay its own
    env.pop("HCTOOL_DEBUG", None)
    if fix:
        env["PROG_FIX"] = "1"
    target = [str(PROGRAMS / program), *(args or [])]
    if wrapper is not None:
        target = wrapper + target
    cmd = [
        sys.executable,
        "-m",
        "hctool",
        "check-consensus",
        "run",
        "--nproc",
        str(nproc),
        "--hang-after",
        "1.5",
        "--timeout",
        "60",
        "--json",
        "--trace-dir",
        str(tmp_path / "trace"),
        *(extra or []),
        "--",
        *target,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    try:
        report = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"stdout is not one JSON document: {proc.stdout!r}\nstderr:\n{proc.stderr}") from exc
    return proc.returncode, report, proc.stderr


def latency_ms(stderr: str) -> float | None:
    for line in stderr.splitlines():
        if "ms after the first divergent call" in line:
            return float(line.split("reported ", 1)[1].split(" ms", 1)[0])
    return None
