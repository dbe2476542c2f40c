"""history.jsonl names what lies in its run folder relative to that folder: an engine rank's death
("see RUN/s1-2/rank1.log") read on another machine, or after the folder moved, still points at
the log beside it; a path outside the folder is the only way to open that file and stays whole."""

from __future__ import annotations

import os

from hctool.chaos.history import History, read_history


def test_paths_in_the_run_folder_are_written_relative_to_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given in (tmp_path / "run", "run"):  # --artifacts given absolute, or relative to where hctool ran
        history = History(os.path.join(given, "history.jsonl"))
        history.add(
            "verdict",
            reason=f"rank 1 died (exit 1); see {tmp_path}/run/s1-2/rank1.log",
            also="run/s1-2/rank0.log",
            elsewhere="/data/run/s1-2/x.bin",  # another folder of the same name
            longer=f"{tmp_path}/runner/x.log",  # a name that starts like the folder's
        )
        history.close()
        (entry,) = read_history(history.path)
        assert entry["reason"] == "rank 1 died (exit 1); see s1-2/rank1.log"
        assert entry["also"] == ("s1-2/rank0.log" if given == "run" else "run/s1-2/rank0.log")
        assert entry["elsewhere"] == "/data/run/s1-2/x.bin"
        assert entry["longer"] == f"{tmp_path}/runner/x.log"
        history.path.unlink()
