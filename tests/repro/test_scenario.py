"""Scenario loading and the catalogue: clear errors that name file and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hctool.cli import app
from hctool.console.errors import UsageError
from hctool.repro.catalogue import builtin_dir, find_scenario, load_catalogue
from hctool.repro.scenario import ScenarioError, load_scenario

BUILTIN = builtin_dir() / "30760" / "scenario.toml"


def _write(tmp_path: Path, text: str, sid: str = "x1") -> Path:
    d = tmp_path / sid
    d.mkdir(parents=True, exist_ok=True)
    (d / "scenario.toml").write_text(text)
    return d / "scenario.toml"


MINIMAL = """
id = "x1"
title = "a test incident"
faults = ["h2d-sleep:rank=1,ms=5"]
[engine]
flags = ["--max-total-tokens", "1024"]
[workload]
rounds = 1
[[variants]]
name = "fixed"
flags = ["--prefetch-vote", "per-tick"]
expected = ["healthy"]
"""


def test_builtin_30760_loads_with_three_variants():
    s = load_scenario(BUILTIN)
    assert s.id == "30760" and s.tp == 2
    assert [v.name for v in s.variants] == ["per-poll", "bulk", "per-tick"]
    assert set(s.variant("per-poll").expected) == {"deadlocked", "crashed", "diverged"}
    assert s.variant("bulk").expected == ("healthy",)
    assert s.server_args(s.variant("per-poll")).variants.prefetch_vote == "per-poll"
    assert s.server_args(s.variant("per-tick")).hicache_storage_backend == "file"


def test_minimal_scenario_gets_defaults(tmp_path):
    s = load_scenario(_write(tmp_path, MINIMAL))
    assert s.tp == 2 and s.workload.rounds == 1 and s.stall_timeout == 20.0


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace('title = "a test incident"\n', ""), "missing field 'title'"),
        (lambda t: t.replace('expected = ["healthy"]', 'expected = ["fine"]'), "expected must list verdicts"),
        (lambda t: t.replace("h2d-sleep:rank=1,ms=5", "h2d-nap:ms=5"), "unknown fault 'h2d-nap'"),
        (lambda t: t.replace("h2d-sleep:rank=1,ms=5", "request-burst:n=3"), "acts on chaos's workload"),
        (lambda t: t.replace("rounds = 1", "rounds = 1\nround = 2"), "unknown fields ['round']"),
        (lambda t: t.replace("rounds = 1", 'rounds = "two"'), "field 'rounds' must be a int"),
        (lambda t: t.replace('"per-tick"]', '"sometimes"]'), "variant 'fixed': engine flags"),
        (lambda t: t + '[[variants]]\nname = "fixed"\nexpected = ["healthy"]\n', "variant names must be unique"),
        (lambda t: t.replace("[engine]", "oops = [").replace('flags = ["--max', 'x = ["--max'), "scenario.toml"),
    ],
)
def test_bad_scenarios_name_the_problem(tmp_path, edit, message):
    path = _write(tmp_path, edit(MINIMAL))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_user_catalogue_adds_and_overrides(tmp_path):
    _write(tmp_path, MINIMAL)
    shutil.copytree(BUILTIN.parent, tmp_path / "30760")
    text = (tmp_path / "30760" / "scenario.toml").read_text().replace("tp = 2", "tp = 4")
    (tmp_path / "30760" / "scenario.toml").write_text(text)
    cat = load_catalogue([tmp_path])
    assert {"30760", "x1"} <= set(cat) and {"38268", "26921", "wall-clock-lru"} <= set(cat)
    assert cat["30760"].tp == 4  # the user's copy wins
    with pytest.raises(ScenarioError, match="no scenario 'nope'"):
        find_scenario("nope", [tmp_path])


def test_repro_list_json_and_errors(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["repro", "list", "--json"])
    assert res.exit_code == 0, res.output
    entries = json.loads(res.stdout)
    e = next(x for x in entries if x["id"] == "30760")
    assert e["upstream"]["issues"] == [30760] and e["topology"] == {"tp": 2}
    assert [v["name"] for v in e["variants"]] == ["per-poll", "bulk", "per-tick"]


def test_repro_cli_usage_errors_exit_2(hctool_cmd, clean_env, tmp_path):
    import subprocess

    bad = _write(tmp_path, MINIMAL.replace('expected = ["healthy"]', "expected = []"))
    cases = [
        ["repro", "nope"],
        ["repro", "30760", "--variant", "sometimes"],
        ["repro", "30760", "--tp", "3"],
        ["repro", "list", "--catalogue", str(tmp_path / "missing")],
        ["repro", "list", "--catalogue", str(bad.parent.parent)],
    ]
    for args in cases:
        out = subprocess.run(hctool_cmd + args, capture_output=True, text=True, env=clean_env, timeout=60)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("Error: ") and "Traceback" not in out.stderr, out.stderr
        assert out.stdout == ""


def test_mechanism_and_measured_in_scenarios(tmp_path):
    bug = MINIMAL.replace(
        'expected = ["healthy"]',
        'expected = ["deadlocked"]\n'
        'mechanism = { function = "check_prefetch_progress" }\n'
        'measured = { runs = 10, as_expected = 9, date = "2026-11-30" }',
    )
    v = load_scenario(_write(tmp_path, bug)).variant("fixed")
    assert v.mechanism.function == "check_prefetch_progress" and v.measured["as_expected"] == 9
    for text, message in (
        (
            MINIMAL.replace('expected = ["healthy"]', 'expected = ["healthy"]\nmechanism = { output = "differs" }'),
            "expected healthy shows no mechanism",
        ),
        (bug.replace("functon", "x").replace("function =", "functon ="), "unknown fields"),
        (bug.replace("as_expected = 9", "as_expected = 11"), "as_expected <= runs"),
    ):
        with pytest.raises(ScenarioError, match=message):
            load_scenario(_write(tmp_path, text))
    per_poll = load_scenario(BUILTIN).variant("per-poll")
    assert per_poll.mechanism.function == "check_prefetch_progress"


def test_repro_all_shards_and_usage():
    from hctool.commands.repro import shard_ids

    ids = ["38268", "30760", "26921", "wall-clock-lru", "27221"]
    parts = [shard_ids(ids, (i, 3)) for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(ids) and not set(parts[0]) & set(parts[1])
    assert shard_ids(ids, (1, 3)) == shard_ids(list(reversed(ids)), (1, 3))  # order-free
    for bad in ("3/2", "x", "0/1"):
        res = CliRunner().invoke(app, ["repro", "all", "--shard", bad])  # hctool's main maps it to exit 2
        assert isinstance(res.exception, UsageError) and "--shard" in str(res.exception), res
