"""`hctool lint` as users run it: formats, exit codes, suppressions, configuration."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hctool.cli import app

FIXTURE = Path(__file__).parent / "fixtures" / "sglang30760"
BAD = """\
import torch.distributed as dist
def on_copy_done(pool, event, pages):  # frees lag per rank: what a free-count finding rests on
    event.query() and pool.free(pages)
def f(pool, t):
    if pool.available_size() > 0:
        dist.all_reduce(t)
"""


@pytest.fixture
def cli(monkeypatch):
    runner = CliRunner()

    def invoke(cwd: Path, *args: str):
        monkeypatch.chdir(cwd)
        return runner.invoke(app, ["lint", *args])

    return invoke


def write(root: Path, name: str, text: str) -> Path:
    p = root / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))
    return p


def test_json_contract_on_the_30760_fixture(cli, tmp_path):
    # A copy outside the repo: the repo's own [tool.hctool.lint] must not apply.
    shutil.copytree(FIXTURE, tmp_path / "sglang30760")
    res = cli(tmp_path, "sglang30760", "--format", "json")
    assert res.exit_code == 1
    (f,) = json.loads(res.stdout)
    assert set(f) == {"rule", "name", "path", "line", "col", "severity", "premise", "count", "message", "related"}
    # One finding at the rank-local source (the KV free count in PrefillAdder), a premise stated.
    assert (f["rule"], f["name"], f["path"], f["line"], f["col"]) == (
        "HC101",
        "collective-in-rank-local-loop",
        "sglang30760/prefill.py",
        9,
        16,
    )
    assert f["severity"] == "medium" and "KV free count" in f["premise"] and f["count"] == 1
    related = [(r["role"], r["path"], r["line"]) for r in f["related"]]
    assert related[:4] == [
        ("collective", "sglang30760/scheduler.py", 20),
        ("loop", "sglang30760/scheduler.py", 16),
        ("condition", "sglang30760/scheduler.py", 17),
        ("exit", "sglang30760/scheduler.py", 19),
    ]
    assert ("chain", "sglang30760/hiradix_cache.py", 18) in related
    assert all(set(r) == {"path", "line", "message", "role"} for r in f["related"])
    alias = cli(tmp_path, "sglang30760", "--json")  # the flag every other command takes
    assert (alias.exit_code, alias.stdout) == (1, res.stdout)


def test_sarif_is_structurally_valid_with_relative_uris(cli, tmp_path):
    (tmp_path / ".git").mkdir()
    write(tmp_path, "pkg/bad.py", BAD)
    res = cli(tmp_path / "pkg", ".", "--format", "sarif")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["version"] == "2.1.0" and "sarif" in doc["$schema"]
    driver = doc["runs"][0]["tool"]["driver"]
    ids = [r["id"] for r in driver["rules"]]
    assert ids == ["HC100", "HC101", "HC102", "HC103", "HC104"]
    assert all(r["name"] and r["shortDescription"]["text"] and r["help"]["text"] for r in driver["rules"])
    (result,) = doc["runs"][0]["results"]
    assert result["ruleId"] == "HC102" and ids[result["ruleIndex"]] == "HC102"
    assert result["level"] == "warning"  # medium severity: a pool free count, under a premise
    assert result["properties"]["premise"] and result["properties"]["count"] == 1
    loc = result["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "pkg/bad.py"  # relative to the git root, not cwd
    assert loc["region"]["startLine"] == 5  # the source: `pool.available_size()`
    assert result["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] == 6  # the collective


def test_github_annotations(cli, tmp_path):
    write(tmp_path, "bad.py", BAD)
    res = cli(tmp_path, "bad.py", "--format", "github")
    assert res.exit_code == 1
    line = res.stdout.strip()
    assert line.startswith("::warning file=bad.py,line=5,col=8,title=HC102 collective-under-rank-local-branch::")


def test_clean_tree_exits_0_and_text_output(cli, tmp_path):
    write(tmp_path, "ok.py", "import torch.distributed as dist\n\ndef f(t):\n    dist.all_reduce(t)\n")
    res = cli(tmp_path, ".")
    assert res.exit_code == 0
    assert "0 findings in 1 file " in res.stdout


def test_text_output_is_one_line_per_finding_as_ruff_prints(cli, tmp_path):
    write(tmp_path, "pkg/bad.py", BAD)
    res = cli(tmp_path, ".")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    # `%f:%l:%c: %m`, what editors' and CI problem matchers parse; the message on the same line.
    head = re.compile(r"^(?P<f>[^\s:][^:]*):(?P<l>\d+):(?P<c>\d+): (?P<m>HC\d{3} .+)$")
    matched = [m for m in map(head.match, lines) if m]
    assert [(m["f"], m["l"], m["c"]) for m in matched] == [("pkg/bad.py", "5", "8")]
    assert matched[0]["m"].startswith("HC102 [medium] rank-local `pool.available_size()`")
    # The message cites the collective by the same path as the location, never a bare file name.
    assert "(pkg/bad.py:6)" in matched[0]["m"] and "(bad.py:6)" not in matched[0]["m"]
    related = lines[lines.index(matched[0].group(0)) + 1]
    assert related.startswith("    pkg/bad.py:6: HC102: collective `dist.all_reduce()` runs only under the condition")
    assert lines[-1].startswith("1 finding in 1 file ")


def test_statistics_prints_counts_only_and_quiet_after_the_subcommand(cli, tmp_path):
    write(tmp_path, "bad.py", BAD)
    res = cli(tmp_path, ".", "--statistics")
    assert res.exit_code == 1
    assert res.stdout.splitlines() == ["     1  HC102  collective-under-rank-local-branch"]
    for flag in ("-q", "--quiet"):
        res = cli(tmp_path, ".", flag)
        assert res.exit_code == 1
        assert [ln.split(":")[:3] for ln in res.stdout.splitlines() if not ln.startswith(" ")] == [["bad.py", "5", "8"]]
        assert "findings in" not in res.stdout and "finding in" not in res.stdout


def test_quiet_and_verbose_after_the_subcommand_as_a_user_types_them(tmp_path, hctool_cmd, clean_env):
    write(tmp_path, "bad.py", BAD)
    for flags in (["-q"], ["-v"], ["-q", "--format", "json"]):
        res = subprocess.run(
            [*hctool_cmd, "lint", "bad.py", *flags],
            cwd=tmp_path,
            env=clean_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 1, (flags, res.stderr)
        assert "Error" not in res.stderr and "No such option" not in res.stderr
    assert (
        "peak memory"
        in subprocess.run(
            [*hctool_cmd, "lint", "bad.py", "-v"],
            cwd=tmp_path,
            env=clean_env,
            capture_output=True,
            text=True,
            timeout=120,
        ).stderr
    )


def test_noqa_codes_are_honoured_and_stale_ones_reported(cli, tmp_path):
    write(
        tmp_path,
        "n.py",
        BAD.replace("dist.all_reduce(t)", "dist.all_reduce(t)  # noqa: E501, HC102")
        + "\n\ndef g():\n    return 1  # noqa: HC101,F401\n\n\ndef h():\n    return 2  # noqa\n",
    )
    res = cli(tmp_path, ".", "--format", "json")
    assert res.exit_code == 1
    found = json.loads(res.stdout)
    # HC102 suppressed by noqa; the HC101 in a noqa that matched nothing is stale (F401 is not ours,
    # and a bare noqa comment names no hctool code, so it is neither honoured nor reported).
    assert [(f["rule"], f["line"]) for f in found] == [("HC100", 10)]
    assert "`noqa: HC101`" in found[0]["message"]
    # The same finding without the comment is there: the noqa did the suppressing.
    write(tmp_path, "n.py", BAD)
    assert [f["rule"] for f in json.loads(cli(tmp_path, ".", "--format", "json").stdout)] == ["HC102"]


def test_parse_error_reported_and_other_findings_kept(cli, tmp_path):
    write(tmp_path, "a_broken.py", "def f(:\n")
    write(tmp_path, "bad.py", BAD)
    res = cli(tmp_path, ".", "--format", "json")
    assert res.exit_code == 2
    assert [f["path"] for f in json.loads(res.stdout)] == ["bad.py"]
    assert "a_broken.py:1: syntax error" in res.stderr


def test_suppression_and_unused_suppression(cli, tmp_path):
    write(
        tmp_path,
        "s.py",
        BAD.replace("dist.all_reduce(t)", "dist.all_reduce(t)  # hctool: ignore[HC102]")
        + "\n\ndef g():\n    return 1  # hctool: ignore[HC101]\n",
    )
    res = cli(tmp_path, ".", "--format", "json")
    assert res.exit_code == 1
    assert [(f["rule"], f["line"]) for f in json.loads(res.stdout)] == [("HC100", 10)]
    res = cli(tmp_path, ".", "--format", "json", "--ignore", "HC100")
    assert res.exit_code == 0 and json.loads(res.stdout) == []


def test_suppression_words_in_strings_are_not_comments(cli, tmp_path):
    # docs that show the syntax (a docstring, a help string) suppress nothing and are not stale
    write(
        tmp_path,
        "d.py",
        'def f():\n    """Silence one line with `# hctool: ignore[HC101]`."""\n    return "# hctool: ignore[HC102]"\n',
    )
    res = cli(tmp_path, ".", "--format", "json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []


def test_select_and_ignore(cli, tmp_path):
    write(tmp_path, "bad.py", BAD)
    assert json.loads(cli(tmp_path, ".", "-f", "json", "--select", "HC101").stdout) == []
    assert len(json.loads(cli(tmp_path, ".", "-f", "json", "--select", "HC1").stdout)) == 1
    assert json.loads(cli(tmp_path, ".", "-f", "json", "--ignore", "HC102").stdout) == []


def test_config_from_pyproject(cli, tmp_path):
    write(
        tmp_path,
        "pyproject.toml",
        """
        [tool.hctool.lint]
        collectives = ["poll_and_all_reduce"]
        rank-local = ["free_slots"]
        uniform = ["agreed_size"]
        exclude = ["vendored/*"]
    """,
    )
    write(
        tmp_path,
        "m.py",
        """
        def f(pool, group):
            if pool.free_slots > 0:
                poll_and_all_reduce(group)
            if pool.agreed_size() > 0:
                poll_and_all_reduce(group)
    """,
    )
    write(tmp_path, "vendored/v.py", BAD)
    res = cli(tmp_path, ".", "--format", "json")
    assert [(f["path"], f["rule"], f["line"]) for f in json.loads(res.stdout)] == [("m.py", "HC102", 3)]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["nope.py"], "no such file or directory"),
        (["--format", "xml", "."], "unknown format"),
        (["--select", "HC999", "."], "unknown rule code"),
        (["--json", "--format", "sarif", "."], "exclude each other"),
    ],
)
def test_usage_errors_exit_2(tmp_path, hctool_cmd, clean_env, args, needle):
    res = subprocess.run([*hctool_cmd, "lint", *args], cwd=tmp_path, env=clean_env, capture_output=True, text=True)
    assert res.returncode == 2
    assert needle in res.stderr and res.stderr.startswith("Error: ") and "Traceback" not in res.stderr


def test_bad_config_key_exits_2(tmp_path, hctool_cmd, clean_env):
    write(tmp_path, "pyproject.toml", "[tool.hctool.lint]\ncolectives = ['x']\n")
    res = subprocess.run([*hctool_cmd, "lint", "."], cwd=tmp_path, env=clean_env, capture_output=True, text=True)
    assert res.returncode == 2 and "unknown key(s) in [tool.hctool.lint]: colectives" in res.stderr


def test_subprocess_json_stdout_is_only_json(tmp_path, hctool_cmd, clean_env):
    write(tmp_path, "bad.py", BAD)
    res = subprocess.run(
        [*hctool_cmd, "lint", ".", "--format", "json"], cwd=tmp_path, env=clean_env, capture_output=True, text=True
    )
    assert res.returncode == 1
    assert json.loads(res.stdout)[0]["rule"] == "HC102"


def test_parallel_run_matches_serial(tmp_path):
    from hctool.lint.config import LintConfig
    from hctool.lint.runner import lint

    for i in range(80):
        write(tmp_path, f"m{i:02d}.py", BAD if i % 7 == 0 else f"def f{i}():\n    return {i}\n")
    cfg = LintConfig(root=tmp_path)
    serial = lint([tmp_path], cfg, jobs=1, cwd=tmp_path)
    parallel = lint([tmp_path], cfg, jobs=2, cwd=tmp_path)
    # `pool.available_size()` in twelve files: one source expression under one premise, one finding
    assert serial.findings == parallel.findings and len(serial.findings) == 1 and serial.findings[0].count == 12


def test_severity_filter_and_premise_accepted_away(cli, tmp_path):
    write(tmp_path, "bad.py", BAD + "\n\ndef g(ev, t):\n    if not ev.query():\n        return\n    dist.barrier()\n")
    res = cli(tmp_path, ".", "-f", "json")
    assert [(f["rule"], f["severity"]) for f in json.loads(res.stdout)] == [("HC102", "medium"), ("HC103", "high")]
    res = cli(tmp_path, ".", "-f", "json", "--severity", "high")
    assert [f["rule"] for f in json.loads(res.stdout)] == ["HC103"]
    write(tmp_path, "pyproject.toml", '[tool.hctool.lint]\nuniform = ["pool-free-count"]\n')
    res = cli(tmp_path, ".", "-f", "json")
    assert [f["rule"] for f in json.loads(res.stdout)] == ["HC103"]  # the premise accepted: no pool finding
    res = cli(tmp_path, ".", "-f", "json", "--severity", "urgent")
    assert "unknown severity 'urgent'" in str(res.exception)  # the CLI's main() turns it into exit 2


def test_suppression_on_the_source_line_suppresses_the_finding(cli, tmp_path):
    write(
        tmp_path,
        "s.py",
        BAD.replace(
            "if pool.available_size() > 0:", "if pool.available_size() > 0:  # hctool: ignore[HC102] frees are agreed"
        ),
    )
    res = cli(tmp_path, ".", "-f", "json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []
