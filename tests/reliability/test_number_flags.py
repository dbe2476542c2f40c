"""Every numeric flag refuses NaN, infinities and values out of range: each numeric option of
hctool's own commands (walked from the real command tree, hctool/console/optlimits.py) and each numeric
field of the engine's ServerArgs (`hctool launch --FLAG`, NUMBER_LIMITS). Each refusal is exit 2
with exactly one `Error:` line naming the flag, before anything runs. Before: `--timeout inf`
ran forever, `--hang-after nan` never reported a hang, `--budget nan` ... were accepted."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import fields

import pytest
import typer

from engine.server_args import NUMBER_LIMITS, ServerArgs, _flag
from hctool.cli import app, main
from hctool.console.optlimits import OPTION_LIMITS, numeric_options
from tests.reliability.helpers import REPO, child_env

BAD_FLOATS = ("nan", "inf", "-inf", "NaN", "1e400")


def _values(low: float, high: float, kind: type) -> list[str]:
    out = [*BAD_FLOATS, str(int(high) * 2 + 1) if kind is int else repr(float(high) * 2 + 1)]
    if low > 0:
        out.append("0")
    else:
        out.append("-1")
    return out


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    return code, capsys.readouterr().err


def _command_options():
    tree = typer.main.get_command(app)
    return [(path[1:], param.opts[0], kind) for path, param, kind in numeric_options(tree)]


def test_every_numeric_option_has_bounds_and_its_default_is_within_them():
    options = _command_options()
    assert len(options) >= 30  # the walk sees the tree (launch, repro, check-consensus, chaos, lint)
    tree = typer.main.get_command(app)
    for path, param, _kind in numeric_options(tree):
        low, high = OPTION_LIMITS[param.opts[0]]
        assert param.default is None or low <= param.default <= high, (path, param.opts[0], param.default)


@pytest.mark.parametrize("path, option, kind", _command_options(), ids=lambda x: x if isinstance(x, str) else None)
def test_every_numeric_option_of_every_command_refuses_bad_values(path, option, kind, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be created by a refused command
    low, high = OPTION_LIMITS[option]
    for raw in _values(low, high, kind):
        code, err = _cli([*path, f"{option}={raw}", *(["--", "x.py"] if path[-1] == "run" else [])], capsys)
        errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
        assert code == 2 and len(errors) == 1 and option in errors[0], (path, option, raw, err)
        assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_every_numeric_engine_field_is_bounded():
    numeric = {f.name for f in fields(ServerArgs) if f.type in ("int", "float", int, float)}
    assert numeric == set(NUMBER_LIMITS)


# launch owns --tp, --pp and --dp (their engine names --tp-size, --pp-size, --dp-size are its
# aliases): the command-option test above bounds them under launch's own names.
@pytest.mark.parametrize("name", sorted(n for n in NUMBER_LIMITS if n not in ("tp_size", "pp_size", "dp_size")))
def test_every_numeric_engine_flag_refuses_bad_values(name, capsys):
    low, high = NUMBER_LIMITS[name]
    kind = int if next(f for f in fields(ServerArgs) if f.name == name).type in ("int", int) else float
    for raw in _values(low, high, kind):
        code, err = _cli(["launch", "--cpu", f"{_flag(name)}={raw}"], capsys)
        errors = [ln for ln in err.splitlines() if ln.startswith("Error:")]
        assert code == 2 and len(errors) == 1 and _flag(name) in errors[0], (name, raw, err)


TICKER = str(REPO / "tests" / "consensus" / "programs" / "ticker.py")


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--cpu", "--disaggregation-transfer-timeout", "nan"],
        ["check-consensus", "run", "--timeout", "inf", "--", TICKER],
        ["check-consensus", "run", "--hang-after", "nan", "--", TICKER],
        ["lint", "--jobs", "nan", TICKER],
    ],
)
def test_a_real_process_refuses_before_it_starts_anything(argv, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hctool", *argv],
        cwd=tmp_path,
        env={**child_env(), "TICKER_SECONDS": "0.5"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("Error:")]
    assert done.returncode == 2 and len(errors) == 1 and done.stdout == "", done.stderr
    assert list(tmp_path.iterdir()) == [], "a refused command created files"
