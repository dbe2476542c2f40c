"""The run folders hctool names itself: ./hctool-runs/<command>-<time>-<pid> (docs/contracts.md, "Run folders").

Made by `new_run_folder`, which keeps the user's working tree tidy:
  - ./hctool-runs/ holds a `.gitignore` of `*` (as pytest does for .pytest_cache): runs never show in
    `git status`. It is written where none is there; one of the user's own is left alone.
  - every folder made here holds a marker, MARKER (JSON: the command, the pid, when); a folder
    without it was not made here and is never touched: one the user named (--trace-dir,
    --artifacts, --run-dir), anything else a user put into hctool-runs/, a link.
  - retention: as a command makes a new folder, its own older marked folders beyond the newest
    KEEP_RUNS_ENV (default DEFAULT_KEEP, 0 keeps all) go, oldest first; a folder whose creator still runs
    (a `launch` serving, a parallel run) is never removed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import psutil

from hctool.console import log
from hctool.console.errors import UsageError
from hctool.protocol import env as protocol_env
from hctool.protocol.safefile import read_regular

RUNS_DIR = Path("hctool-runs")
MARKER = ".hctool-run"
KEEP_RUNS_ENV = protocol_env.KEEP_RUNS
DEFAULT_KEEP = 5
MAX_MARKER_BYTES = 4096
GITIGNORE = "# Made by hctool: its run folders are outputs, not sources.\n*\n"


def keep_runs() -> int:
    """How many run folders per command to keep (HCTOOL_KEEP_RUNS; 0: all)."""
    raw = os.environ.get(KEEP_RUNS_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEP
    if not raw.isdigit():
        raise UsageError(
            f"{KEEP_RUNS_ENV} must be a whole number of runs to keep, got {raw!r}",
            f"e.g. {KEEP_RUNS_ENV}=10, or {KEEP_RUNS_ENV}=0 to keep every run",
        )
    return int(raw)


def new_run_folder(command: str, label: str | None = None, root: Path = RUNS_DIR) -> Path:
    """Make and return root/<label>-<time>-<pid> (label: the command by default), marked as
    hctool's, after removing `command`'s oldest runs beyond the number kept. Call it once the
    command's arguments are checked: a usage error leaves no folder."""
    return make_run_folder(run_folder_name(command, label, root), command)


def run_folder_name(command: str, label: str | None = None, root: Path = RUNS_DIR) -> Path:
    """The name new_run_folder would make, for a command that needs it before it may make it."""
    return root / f"{label or command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def make_run_folder(folder: Path, command: str) -> Path:
    """Make `folder` (named by run_folder_name) in its runs folder as new_run_folder does."""
    keep = keep_runs()
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    _ignore_in_git(root)
    if keep:
        removed = prune(root, command, keep - 1)  # room for the one made now
        if removed:
            log.info(
                f"hctool: removed {len(removed)} older {command} run(s) from {root} "
                f"(keeping the newest {keep}; {KEEP_RUNS_ENV}=0 keeps all)"
            )
    folder.mkdir(exist_ok=True)  # the same second and pid: the same run asking twice
    stamp = {"command": command, "pid": os.getpid(), "created": time.time()}
    fd = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(stamp, f)
    return folder


def _ignore_in_git(root: Path) -> None:
    try:  # O_EXCL: an existing .gitignore (the user's, or a link) is not opened, let alone rewritten
        fd = os.open(root / ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(GITIGNORE)


def marked_runs(root: Path, command: str) -> list[tuple[float, Path, int]]:
    """(created, folder, pid) of each folder directly in `root` that hctool made for `command`."""
    out = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        try:
            if not stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode):
                continue  # a link to a folder is not a folder hctool made
            doc = json.loads(read_regular(Path(entry.path) / MARKER, MAX_MARKER_BYTES))
        except (OSError, ValueError):
            continue  # no marker (or not a plain small file): not hctool's
        if not isinstance(doc, dict) or doc.get("command") != command:
            continue
        created, pid = doc.get("created"), doc.get("pid")
        if isinstance(created, (int, float)) and isinstance(pid, int):
            out.append((float(created), Path(entry.path), pid))
    return out


def prune(root: Path, command: str, keep: int) -> list[Path]:
    """Remove `command`'s marked runs beyond the newest `keep` whose creator has ended; the removed."""
    ended = [(created, folder) for created, folder, pid in marked_runs(root, command) if not _alive(pid)]
    ended.sort(reverse=True)
    removed = []
    for _, folder in ended[keep:]:
        try:
            shutil.rmtree(folder)  # never follows a link inside (the fd-based rmtree of Linux)
        except OSError as exc:
            log.info(f"hctool: could not remove the old run {folder}: {exc.strerror or exc}")
            continue
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
