"""README.md's lint section: the example program, linted by the command the README names, prints
exactly the README's sample (no configuration: the pool's free count and the rank id are found by
the linter's own rules). Change the rules or the text format and this fails until the sample is
made again by running the command on the example."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "<!-- lint example: mypkg/tp.py (tests/lint/test_readme_lint.py) -->"
SAMPLE = "<!-- sample: hctool lint mypkg -q (tests/lint/test_readme_lint.py) -->"
END = "<!-- end of sample -->"


def block(begin: str) -> str:
    text = (REPO / "README.md").read_text()
    assert begin in text, f"README.md lost its marker {begin}"
    body = text.split(begin, 1)[1].split(END, 1)[0].strip()
    assert body.startswith("```") and body.endswith("```"), body[:80]
    return body.split("\n", 1)[1].rsplit("```", 1)[0]


def test_readme_lint_sample_is_what_the_command_prints(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "tp.py").write_text(block(EXAMPLE))
    # a pipe, no colour and a narrow terminal: the lines must come out whole, as a user's CI reads them
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env.update(HCTOOL_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="80", NO_COLOR="1")
    res = subprocess.run(
        [sys.executable, "-m", "hctool", "lint", "mypkg", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stderr
    assert res.stdout == block(SAMPLE), res.stdout
    # what the prose around the sample says of it
    assert "[medium]" in res.stdout and "[high] rank-local `rank`" in res.stdout
    assert "mypkg/tp.py:23" not in res.stdout  # broadcast_config's arms pair
