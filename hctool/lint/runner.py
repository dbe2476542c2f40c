"""Find the files, run both passes (in parallel over files) and collect a sorted report."""

from __future__ import annotations

import fnmatch
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from hctool import log
from hctool import progress as hprogress
from hctool.errors import UsageError
from hctool.lint.analysis import check_file, summarize_file, suppressions
from hctool.lint.checks import gated_callers
from hctool.lint.config import LintConfig
from hctool.lint.project import Project
from hctool.lint.source import read_source

SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache",
                       ".ruff_cache", ".pytest_cache", "node_modules", ".eggs"})
PARALLEL_MIN_FILES = 64  # below this, worker start-up costs more than it saves


@dataclass
class FileError:
    path: str
    line: int
    message: str


@dataclass
class Report:
    findings: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    files: int = 0
    lines: int = 0
    seconds: float = 0.0
    root: Path = field(default_factory=Path.cwd)

    @property
    def exit_code(self) -> int:
        return 2 if self.errors else (1 if self.findings else 0)


def _display(p: Path, cwd: Path) -> str:
    try:
        return p.relative_to(cwd).as_posix()
    except ValueError:
        return p.as_posix()


def _excluded(p: Path, cfg: LintConfig, cwd: Path) -> bool:
    if not cfg.exclude:
        return False
    candidates = {_display(p, cwd), _display(p, cfg.root), p.name}
    return any(fnmatch.fnmatch(c, pat) or fnmatch.fnmatch(c, pat.rstrip("/") + "/*")
               for c in candidates for pat in cfg.exclude)


def discover(paths: list[Path], cfg: LintConfig, cwd: Path) -> list[Path]:
    found: set[Path] = set()
    for given in paths:
        p = (cwd / given).resolve() if not given.is_absolute() else given.resolve()
        if not p.exists():
            raise UsageError(f"no such file or directory: {given}", "pass Python files or directories to lint")
        if not p.is_dir():
            found.add(p)  # named explicitly: linted even if it does not end in .py (read_source refuses a FIFO)
            continue
        for dirpath, dirnames, filenames in os.walk(p):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS
                                 and not _excluded(Path(dirpath, d), cfg, cwd))
            for name in filenames:
                if name.endswith(".py"):
                    f = Path(dirpath, name)
                    if not _excluded(f, cfg, cwd):
                        found.add(f)
    return sorted(found)


_pkg_cache: dict[Path, bool] = {}


def module_name(p: Path) -> str:
    """Dotted module name, climbing while the directory is a package."""
    parts = [] if p.name == "__init__.py" else [p.stem]
    d = p.parent
    while True:
        is_pkg = _pkg_cache.get(d)
        if is_pkg is None:
            is_pkg = _pkg_cache[d] = (d / "__init__.py").is_file()
        if not is_pkg:
            break
        parts.append(d.name)
        d = d.parent
    return ".".join(reversed(parts)) or p.stem


def find_root(cwd: Path) -> Path:
    """The git work tree above cwd, else cwd: SARIF URIs are relative to it."""
    for d in (cwd, *cwd.parents):
        if (d / ".git").exists():
            return d
    return cwd


# Worker state is set before the pool forks, so the project is shared, not pickled per task.
_STATE: dict = {}


def _pass1(job: tuple):
    file, path, modname = job
    return summarize_file(file, path, modname, _STATE["cfg"])


def _pass2(job: tuple):
    file, path, modname = job
    return path, check_file(file, path, modname, _STATE["cfg"], _STATE["project"])


def _map(fn, jobs: list, workers: int, bar=None) -> list:
    """fn over jobs in order; `bar` (hctool.progress) advances once a file."""
    def counted(results):
        out = []
        for res in results:
            out.append(res)
            if bar is not None:
                bar.update(advance=1)
        return out
    if workers <= 1 or len(jobs) < PARALLEL_MIN_FILES or "fork" not in multiprocessing.get_all_start_methods():
        return counted(fn(j) for j in jobs)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return counted(pool.imap(fn, jobs, chunksize=max(1, len(jobs) // (workers * 8))))


def lint(paths: list[Path], cfg: LintConfig, jobs: int | None = None, cwd: Path | None = None,
         progress=None) -> Report:
    cwd = (cwd or Path.cwd()).resolve()
    started = time.perf_counter()
    files = discover(paths, cfg, cwd)
    workers = jobs or os.cpu_count() or 1
    job_list = [(str(f), _display(f, cwd), module_name(f)) for f in files]
    _STATE.update(cfg=cfg)
    with hprogress.task("lint", total=len(files), text="pass 1: files summarized") as bar:
        return _lint(files, job_list, cfg, workers, progress, bar, started, cwd)


def _lint(files, job_list, cfg, workers, progress, bar, started, cwd) -> Report:
    if progress:
        progress(f"pass 1: summarizing {len(files)} files")
    summaries = _map(_pass1, job_list, workers, bar)
    project = Project(summaries)
    _STATE["project"] = project
    report = Report(files=len(files), lines=sum(s.lines for s in summaries), root=find_root(cwd))
    wanted = [j for j, s in zip(job_list, summaries)
              if s.error is None and (s.wants_check or project.module_has_collectives(s))]
    if progress:
        progress(f"pass 2: checking {len(wanted)} files with collectives ({len(project.coll)} collective sites)")
    bar.update(completed=0, total=len(wanted), text="pass 2: files with collectives checked")
    for s in summaries:
        if s.error:
            report.errors.append(FileError(s.path, *s.error))
    for path, result in _map(_pass2, wanted, workers, bar):
        report.findings += result.findings
        if result.error:
            report.errors.append(FileError(path, *result.error))
    _add_gated_callers(report, project, summaries, job_list, cfg)
    report.findings.sort()
    report.errors.sort(key=lambda e: (e.path, e.line))
    report.seconds = time.perf_counter() - started
    _STATE.clear()
    return report


def _add_gated_callers(report: Report, project: Project, summaries: list, job_list: list, cfg: LintConfig) -> None:
    """Pass 3: call sites of rank-local polls that hide a collective, with their suppressions."""
    if "HC102" not in cfg.select:
        return
    files = {path: file for file, path, _ in job_list}
    seen = {(f.path, f.line, f.rule) for f in report.findings}
    for f in gated_callers(report.findings, project, summaries):
        if (f.path, f.line, f.rule) in seen:
            continue
        seen.add((f.path, f.line, f.rule))
        try:
            table = suppressions(read_source(files[f.path]).decode(errors="replace"))
        except OSError:
            table = {}
        hit = next((ln for ln in range(f.line, f.end_line + 1) if ln in table and f.rule in table[ln][1]), None)
        if hit is None:
            report.findings.append(f)
        else:  # the comment is used after all
            report.findings = [x for x in report.findings
                               if not (x.rule == "HC100" and x.path == f.path and x.line == hit and f.rule in x.message)]


def stderr_progress(message: str) -> None:
    log.info(message)
