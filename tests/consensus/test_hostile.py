"""`check-consensus analyze` on folders someone else made, and `run` on
programs that fail: one-line errors (exit 2) or a `crashed` verdict (exit 1),
never code execution, a hang, a memory blow-up or a traceback."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from hctool.cli import main

pytestmark = pytest.mark.timeout(60)


def _analyze(path, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["check-consensus", "analyze", str(path), "--json"])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _assert_one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (out, err)
    assert out == ""
    first = err.splitlines()[0]
    assert first.startswith("Error: ") and needle in first, err
    assert "internal error" not in err and "Traceback" not in err


class _RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path, capsys):
    folder = tmp_path / "dumps"
    folder.mkdir()
    marker = tmp_path / "pwned"
    (folder / "rank0").write_bytes(pickle.dumps({"entries": [], "payload": _RunsCode(str(marker))}))
    code, out, err = _analyze(folder, capsys)
    _assert_one_line_error(code, out, err, "refusing to load")
    assert "system" in err
    assert not marker.exists()  # the pickle's code did not run


def _header(world_size=2, rank=0) -> str:
    return json.dumps({"hdr": 2, "rank": rank, "world_size": world_size, "pid": 1, "start": 0.0, "mono": 0.0})


@pytest.mark.parametrize(
    "case,needle",
    [
        ("fifo", "not a regular file"),
        ("symlink_dev_zero", "cannot be read as a regular file"),
        ("ring_symlink_dev_zero", "cannot be read as a regular file"),
        ("world_1e8", "world_size 100000000"),
        ("world_far_beyond_files", "claims world_size 60000"),
        ("json_string_line", "rank0-1.jsonl:2"),
        ("junk_line", "rank0-1.jsonl:2"),
        ("deeply_nested_line", "nested too deeply"),
        ("rank_beyond_world", "world_size 2"),
        ("ring_unknown_ids", "rank0-1.ring"),
    ],
)
def test_hostile_trace_folder_is_a_one_line_error(case, needle, tmp_path, capsys):
    folder = tmp_path / "t"
    folder.mkdir()
    side = folder / "rank0-1.jsonl"
    if case == "fifo":
        os.mkfifo(side)  # opening it for reading would block forever
    elif case == "symlink_dev_zero":
        os.symlink("/dev/zero", side)  # reading it would never end
    elif case == "ring_symlink_dev_zero":
        side.write_text(_header() + "\n")
        os.symlink("/dev/zero", folder / "rank0-1.ring")
    elif case == "world_1e8":
        side.write_text(_header(world_size=10**8) + "\n")
    elif case == "world_far_beyond_files":
        side.write_text(_header(world_size=60000) + "\n")
    elif case == "json_string_line":
        side.write_text(_header() + '\n"just a string"\n')
    elif case == "junk_line":
        side.write_text(_header() + "\n{not json at all\n")
    elif case == "deeply_nested_line":
        side.write_text(_header() + "\n" + "[" * 200_000 + "]" * 200_000 + "\n")
    elif case == "rank_beyond_world":
        side.write_text(_header() + "\n")
        (folder / "rank7-2.jsonl").write_text(_header(rank=7) + "\n")
    elif case == "ring_unknown_ids":
        from hctool.protocol.records import CALL, KIND_CALL

        side.write_text(_header() + "\n")
        (folder / "rank0-1.ring").write_bytes(CALL.pack(KIND_CALL, 2, 0, 9, 9, 9, 9, 9, 0, -1, 0, 1.0, 2.0))
    code, out, err = _analyze(folder, capsys)
    _assert_one_line_error(code, out, err, needle)


def test_run_is_never_consistent_when_ranks_exit_nonzero(
    tmp_path, hctool_cmd, clean_env, capsys, no_leftover_processes
):
    script = tmp_path / "exits3.py"
    script.write_text("import sys\nsys.exit(3)\n")
    proc = subprocess.run(
        [*hctool_cmd, "check-consensus", "run", "--json", "--trace-dir", str(tmp_path / "t"), "--", str(script)],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=60,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    assert report["verdict"] == "crashed"
    assert report["exit_codes"] == {"0": 3, "1": 3}
    code, out, _ = _analyze(tmp_path / "t", capsys)  # the run's exit codes are read back
    assert code == 1 and json.loads(out)["verdict"] == "crashed"


def test_run_is_never_consistent_when_the_command_fails(tmp_path, hctool_cmd, clean_env, capsys, no_leftover_processes):
    proc = subprocess.run(
        [
            *hctool_cmd,
            "check-consensus",
            "run",
            "--json",
            "--trace-dir",
            str(tmp_path / "t"),
            "--",
            sys.executable,
            "-c",
            "import sys; sys.exit(4)",
        ],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=60,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    assert report["verdict"] == "crashed" and report["command_exit_code"] == 4
    with pytest.raises(SystemExit) as exc:  # the text report says why, with the evidence line
        main(["check-consensus", "analyze", str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert exc.value.code == 1 and "CRASHED" in out and "command: 4" in out and "counts:" in out
