"""Lint's memory per file is bounded (issue 33): a file whose tree would outgrow the budget is
refused with the reason, the other files' findings are kept; a large file that fits is analyzed."""

from __future__ import annotations

import json
import subprocess

BAD = (
    "import torch.distributed as dist\n\n\n"
    "def f(pool, t):\n    if pool.available_size() > 0:\n        dist.all_reduce(t)\n"
    # the pool's frees lag on each rank (an event poll): what a free-count finding rests on
    "\n\ndef on_copy_done(pool, event, pages):\n    if event.query():\n        pool.free(pages)\n"
)


def _lint(tmp_path, hctool_cmd, clean_env, *args):
    return subprocess.run(
        [*hctool_cmd, "lint", ".", "--format", "json", "--no-cache", *args],
        cwd=tmp_path,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_dense_file_over_the_budget_is_refused_with_its_reason(tmp_path, hctool_cmd, clean_env):
    (tmp_path / "pyproject.toml").write_text("[tool.hctool.lint]\nmemory-per-file = 64\n")
    # 1.3 MB of calls: about 500 MB of syntax tree, far over 64 MiB (bounded.py's measure).
    (tmp_path / "generated.py").write_text("".join(f"a{i % 7} = f(b, c[{i % 5}], d.e)\n" for i in range(62000)))
    (tmp_path / "bad.py").write_text(BAD)
    res = _lint(tmp_path, hctool_cmd, clean_env)
    assert res.returncode == 2, res.stderr
    assert [(f["path"], f["rule"]) for f in json.loads(res.stdout)] == [("bad.py", "HC102")]
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert errors == [
        "Error: generated.py:1: needs more than 64 MiB of memory to parse (lint's budget per file, "
        "[tool.hctool.lint] memory-per-file)"
    ]


def test_a_large_file_within_the_budget_is_analyzed_in_its_child(tmp_path, hctool_cmd, clean_env):
    (tmp_path / "pyproject.toml").write_text("[tool.hctool.lint]\nmemory-per-file = 64\n")
    # Over the 1 MiB threshold, but a docstring parses to one node: the child answers, the finding is there.
    (tmp_path / "big.py").write_text('"""' + "x" * (1 << 20) + '"""\n' + BAD)
    res = _lint(tmp_path, hctool_cmd, clean_env)
    assert res.returncode == 1, res.stderr
    assert [(f["path"], f["rule"], f["line"]) for f in json.loads(res.stdout)] == [("big.py", "HC102", 6)]


def test_a_budget_out_of_bounds_is_one_error_line(tmp_path, hctool_cmd, clean_env):
    (tmp_path / "bad.py").write_text(BAD)
    for value in ("1", "-5", '"lots"', "1e400"):
        (tmp_path / "pyproject.toml").write_text(f"[tool.hctool.lint]\nmemory-per-file = {value}\n")
        res = _lint(tmp_path, hctool_cmd, clean_env)
        assert res.returncode == 2 and res.stdout == ""
        assert [ln for ln in res.stderr.splitlines() if ln.strip()][0].startswith("Error:")
        assert "memory-per-file must be an integer number of MiB" in res.stderr
