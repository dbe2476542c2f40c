"""Every command's --help names what an option takes in words a user reads (N, SECONDS, PATH, a name
of the option), never a Python type: typer 0.29 printed `<list[str]>`, `<int range> [x>=1]` and
`<bool>` beside flags. One mechanism in hctool/cli.py covers every command; this walks them all."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from hctool.cli import command

PYTHON_TYPES = ("<list[", "<int", "<float", "<str>", "<bool>", "<Path>", "<path>", "<tuple")


def _paths(cmd, path=()):
    yield path
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _paths(sub, (*path, name))


def _help(path: tuple[str, ...], capsys) -> str:
    with pytest.raises(SystemExit) as ended:
        command().main(args=[*path, "--help"], prog_name="hctool")
    assert ended.value.code == 0
    return capsys.readouterr().out


def _row(text: str, option: str) -> str:
    """The help row of `option` (its first line), the table's borders left out."""
    rows = [ln.strip("│ ") for ln in text.splitlines() if re.search(rf"(^|\s){re.escape(option)}(\s|,|$)", ln)]
    assert rows, f"{option} not in:\n{text}"
    return rows[0]


COMMANDS = list(_paths(command()))


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "hctool")
def test_no_python_type_in_any_help(path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one row per option: a type cut over two lines would hide
    text = _help(path, capsys)
    assert "Usage:" in text
    found = [t for t in PYTHON_TYPES if t in text]
    assert not found, f"hctool {' '.join(path)} --help shows {found}:\n{text}"


def test_each_kind_of_option_reads_as_what_it_takes(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    text = _help(("check-consensus", "run"), capsys)
    assert re.match(r"--nproc\s+-n\s+N\s", _row(text, "--nproc"))
    assert re.match(r"--timeout\s+SECONDS\s", _row(text, "--timeout"))
    assert re.match(r"--hang-after\s+SECONDS\s", _row(text, "--hang-after"))
    assert re.match(r"--trace-dir\s+DIR\s", _row(text, "--trace-dir"))
    assert re.match(r"--on-divergence\s+ON_DIVERGENCE\s", _row(text, "--on-divergence"))
    assert re.match(r"--inject\s+INJECT\s", _row(text, "--inject"))  # a list: its item's
    assert re.match(r"--json\s+Print", _row(text, "--json"))  # a flag takes nothing
    text = _help(("lint",), capsys)
    assert re.search(r"PATHS\s+Python files", text) and "{PATHS}..." in text  # an argument: its name, no type beside it
    assert re.match(r"--verbose\s+-v\s+More", _row(text, "--verbose"))  # a count is a flag too


def test_help_as_a_user_runs_it(tmp_path):
    """The same through `python -m hctool` at a terminal's usual width."""
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "chaos", "explore", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, COLUMNS="100"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "--budget" in proc.stdout and "SECONDS" in proc.stdout
    assert not [t for t in PYTHON_TYPES if t in proc.stdout], proc.stdout
