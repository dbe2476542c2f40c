"""Adopting the linter on an existing codebase: a baseline of known findings, and `--diff REF`.

A baseline entry is keyed on what survives unrelated edits: the rule, the repo-relative path,
the enclosing function and the whitespace-normalized text of the reported line (the rank-local
source) and of the first deciding condition, with a count. Line numbers are not part of the key.
Version 1 baselines keyed findings on their collective line, before findings were one per root
cause; they are refused with a hint to regenerate.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from hctool.console.errors import UsageError

BASELINE_VERSION = 2
_COMMENT = re.compile(r"\s+#[^'\"]*$")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class Key(NamedTuple):
    rule: str
    path: str
    function: str
    source: str
    condition: str


class BaselineResult(NamedTuple):
    new: list  # findings not covered by the baseline
    fixed: list  # (Key, count) entries that matched nothing


class _Lines:
    """Line texts of the findings' files, read once."""

    def __init__(self, cwd: Path):
        self.cwd, self.cache = cwd, {}

    def get(self, path: str, line: int) -> str:
        if path not in self.cache:
            try:
                self.cache[path] = (self.cwd / path).read_text(errors="replace").splitlines()
            except OSError:
                self.cache[path] = []
        lines = self.cache[path]
        if not 0 < line <= len(lines):
            return ""
        return " ".join(_COMMENT.sub("", lines[line - 1]).split())  # edits to comments keep the key


def _condition_line(f) -> tuple[str, int]:
    """The deciding line: the first related condition (or loop), else the source's own line."""
    for r in f.related:
        if r.role in ("condition", "loop"):
            return r.path, r.line
    return f.path, f.line


def key(f, rel_path: str, lines: _Lines) -> Key:
    cond = _condition_line(f)
    return Key(f.rule, rel_path, f.function, lines.get(f.path, f.line), lines.get(*cond))


def write_baseline(file: Path, findings: list, rel, cwd: Path) -> int:
    lines = _Lines(cwd)
    counts = Counter(key(f, rel(f.path), lines) for f in findings)
    entries = [{**k._asdict(), "count": n} for k, n in sorted(counts.items())]
    doc = {"version": BASELINE_VERSION, "tool": "hctool lint", "entries": entries}
    try:
        file.write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write baseline {file}: {exc.strerror}", "check the path") from None
    return len(entries)


def read_baseline(file: Path) -> Counter:
    try:
        doc = json.loads(file.read_text())
    except FileNotFoundError:
        raise UsageError(f"baseline file not found: {file}", "create it with --write-baseline FILE") from None
    except OSError as exc:
        raise UsageError(f"cannot read baseline {file}: {exc.strerror}", None) from None
    except ValueError as exc:
        raise UsageError(f"invalid baseline {file}: not JSON ({exc})", "regenerate it with --write-baseline") from None
    if isinstance(doc, dict) and doc.get("version") == 1:
        raise UsageError(
            f"baseline {file} is version 1 (one finding per collective call), and findings are now "
            "one per rank-local source",
            "regenerate it with --write-baseline",
        )
    try:
        if doc["version"] != BASELINE_VERSION:
            raise ValueError(f"version {doc['version']!r}")
        out = Counter()
        for e in doc["entries"]:
            k = Key(*(str(e[f]) for f in Key._fields))
            n = e["count"]
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"count {n!r}")
            out[k] += n
        return out
    except KeyError as exc:
        raise UsageError(f"invalid baseline {file}: missing key {exc}", "regenerate it with --write-baseline") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid baseline {file}: bad entry ({exc})", "regenerate it with --write-baseline") from None


def apply_baseline(findings: list, baseline: Counter, rel, cwd: Path) -> BaselineResult:
    lines, left, new = _Lines(cwd), Counter(baseline), []
    for f in findings:
        k = key(f, rel(f.path), lines)
        if left[k] > 0:
            left[k] -= 1
        else:
            new.append(f)
    fixed = [(k, n) for k, n in sorted(left.items()) if n > 0]
    return BaselineResult(new, fixed)


def _git(root: Path, *args: str) -> str:
    try:
        res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UsageError("--diff needs git, which is not installed", None) from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git {args[0]} took longer than 60 s", None) from None
    if res.returncode != 0:
        raise _GitFailed(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"git {args[0]} failed")
    return res.stdout


class _GitFailed(Exception):
    pass


def changed_lines(where: Path, ref: str) -> tuple[Path, dict]:
    """(git top level, {absolute path: set of changed line numbers or None for a whole new file})."""
    where = where if where.is_dir() else where.parent
    try:
        top = Path(_git(where, "rev-parse", "--show-toplevel").strip()).resolve()
    except _GitFailed:
        raise UsageError(
            f"--diff needs a git repository, and {where} is not inside one", "lint files in a git work tree"
        ) from None
    try:
        _git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except _GitFailed:
        raise UsageError(f"unknown git ref {ref!r}", "pass a branch, tag or commit, e.g. --diff origin/main") from None
    diff = _git(top, "diff", "--unified=0", "--no-color", "--no-ext-diff", "--no-renames", ref, "--")
    changed: dict = {}
    current = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:]
            current = None if name == "/dev/null" else changed.setdefault((top / name[2:]).resolve(), set())
        elif current is not None and (m := _HUNK.match(line)):
            start, count = int(m.group(1)), int(m.group(2) or 1)
            # A pure deletion (count 0) changes the lines around it.
            current.update(range(start, start + count) if count else (start, start + 1))
    for name in _git(top, "ls-files", "--others", "--exclude-standard").splitlines():
        changed[(top / name).resolve()] = None  # untracked: every line is new
    return top, changed


def filter_diff(findings: list, cwd: Path, where: Path, ref: str) -> list:
    _, changed = changed_lines(where, ref)

    def touched(path: str, line: int) -> bool:
        lines = changed.get((cwd / path).resolve(), set())
        return lines is None or line in lines

    return [f for f in findings if touched(f.path, f.line) or any(touched(r.path, r.line) for r in f.related)]
