"""Hostile scenario files: every number range-checked, every type checked, bad
encodings and odd files named; one line naming file and field, exit 2 on the CLI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hctool.repro.scenario import ScenarioError, load_scenario

MINIMAL = """id = "x1"
title = "a test incident"
faults = ["h2d-sleep:rank=1,ms=5"]
[engine]
flags = ["--max-total-tokens", "1024"]
[workload]
rounds = 1
[run]
deadline = 60
[[variants]]
name = "fixed"
expected = ["healthy"]
"""


def _write(tmp_path: Path, text: str | bytes) -> Path:
    d = tmp_path / "x1"
    d.mkdir(exist_ok=True)
    path = d / "scenario.toml"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


CASES = [  # (edits of MINIMAL..., text the one-line error must contain)
    (("rounds = 1", "rounds = 100000000000000000"), "field 'rounds' must be between 1 and 10000"),
    (("rounds = 1", "rounds = 1\nhot_prefixes = -3"), "field 'hot_prefixes' must be between 0"),
    (("rounds = 1", "rounds = 1\nmax_new_tokens = 0"), "field 'max_new_tokens' must be between 1"),
    (("rounds = 1", "rounds = 1\nseed = -1"), "field 'seed' must be between 0"),
    (("rounds = 1", "rounds = 10000\nrequests_per_round = 10000"), "prompt tokens; at most"),
    (("rounds = 1", "rounds = 1\nprefix_tokens = 5000"), "does not fit its pool"),
    (("deadline = 60", "deadline = -1"), "field 'deadline' must be between 0 and 86400, got -1.0"),
    (("deadline = 60", "deadline = 0"), "field 'deadline' must be above 0"),
    (("deadline = 60", "stall_timeout = nan"), "field 'stall_timeout' must be between"),
    (("deadline = 60", "hang_after = inf"), "field 'hang_after' must be between"),
    (("deadline = 60", "deadline = true"), "field 'deadline' must be a float"),
    (("deadline = 60", "deadlines = 5"), "[run]: unknown fields ['deadlines']"),
    (
        ('[[variants]]\nname = "fixed"\nexpected = ["healthy"]\n', ""),
        ('id = "x1"', 'id = "x1"\nvariants = [1, 2]'),
        "variants[0]: must be a [[variants]] table, got 1",
    ),
    (('name = "fixed"', 'name = "../../etc"'), "field 'name' must be 1-64 letters"),
    (('id = "x1"', 'id = "a/b"'), "field 'id' must be 1-64 letters"),
    (("[run]", "[topology]\ntp = 0\n[run]"), "field 'tp' must be between 1 and 64"),
    (("[run]", "[topology]\ntp = 1.5\n[run]"), "field 'tp' must be a int"),
    (("[run]", "[upstream]\nissues = 5\n[run]"), "field 'issues' must be a list of integers"),
    (("[run]", "[upstream]\nwhen = 2024-01-01\n[run]"), "[upstream] may hold strings"),
    (('id = "x1"', 'id = "x1"\ncolour = "red"'), "unknown fields ['colour']"),
    (
        ('[[variants]]\nname = "fixed"\nexpected = ["healthy"]\n', ""),
        ('id = "x1"', 'id = "x1"\nvariants = "all"'),
        "field 'variants' must be a list",
    ),
    (('"1024"]', '"1024", "--hicache-ratio", "nan"]'), "engine flags: --hicache-ratio must be between"),
    (('"1024"]', '"1024", "--dist-timeout", "-1"]'), "engine flags: --dist-timeout must be between"),
    (('"1024"]', '"1000000000000"]'), "engine flags: --max-total-tokens must be between"),
    (("ms=5", "ms=nan"), "ms must be a finite number"),
    (("ms=5", "ms=1e300"), "ms must be between 0 and"),
    (("rounds = 1", "rounds = " + "[" * 5000 + "]" * 5000), "scenario.toml"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[-1][:40] for c in CASES])
def test_hostile_field_is_one_named_error(tmp_path, case):
    *edits, message = case
    text = MINIMAL
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = _write(tmp_path, text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    text = str(err.value)
    assert message in text and str(path) in text and "\n" not in text, text


def test_minimal_is_valid(tmp_path):
    assert load_scenario(_write(tmp_path, MINIMAL)).deadline == 60.0


def test_not_utf8_names_the_byte(tmp_path):
    path = _write(tmp_path, MINIMAL.encode().replace(b"a test incident", b"caf\xe9"))
    with pytest.raises(ScenarioError, match=r"not UTF-8 text \(byte 0xe9 at offset \d+\)"):
        load_scenario(path)


def test_fifo_and_device_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "x1" / "scenario.toml"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(ScenarioError, match="not a regular file"):
        load_scenario(fifo)
    fifo.unlink()
    fifo.symlink_to("/dev/zero")
    with pytest.raises(ScenarioError, match="not a regular file"):
        load_scenario(fifo)


def test_huge_file_is_refused(tmp_path):
    path = _write(tmp_path, MINIMAL + "# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ScenarioError, match="larger than 1024 KiB"):
        load_scenario(path)


def test_cli_exits_2_with_one_line(hctool_cmd, clean_env, tmp_path):
    _write(tmp_path, MINIMAL.replace("rounds = 1", "rounds = 100000000000000000"))
    res = subprocess.run(
        [*hctool_cmd, "repro", "list", "--catalogue", str(tmp_path)],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=60,
    )
    assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
    assert res.stderr.startswith(f"Error: {tmp_path / 'x1' / 'scenario.toml'} [workload]: field 'rounds'")
