"""Find the files, run both passes (in parallel over files) and collect a sorted report."""

from __future__ import annotations

import fnmatch
import gc
import multiprocessing
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path

from hctool.console import log
from hctool.console import progress as hprogress
from hctool.console.errors import UsageError
from hctool.lint import sources as S
from hctool.lint.analysis import FileResult, check_file, summarize_file, suppress, unused_suppressions, walked
from hctool.lint.cache import Cache, digest, still_valid
from hctool.lint.checks import gated_callers
from hctool.lint.config import LintConfig
from hctool.lint.project import ModuleSummary, Project
from hctool.lint.rootcause import fold
from hctool.lint.source import read_source
from hctool.lint.unbuilt import unbuilt

SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "node_modules",
        ".eggs",
    }
)
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
    analyzed: dict = field(default_factory=dict)  # files analyzed afresh per pass (the rest came from the cache)

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
    return any(
        fnmatch.fnmatch(c, pat) or fnmatch.fnmatch(c, pat.rstrip("/") + "/*") for c in candidates for pat in cfg.exclude
    )


def discover(paths: list[Path], cfg: LintConfig, cwd: Path) -> dict[Path, Path | None]:
    """{file: the directory it was found under (None for a file named on the command line)}."""
    found: dict[Path, Path | None] = {}
    for given in paths:
        p = (cwd / given).resolve() if not given.is_absolute() else given.resolve()
        if not p.exists():
            raise UsageError(f"no such file or directory: {given}", "pass Python files or directories to lint")
        if not p.is_dir():
            found[p] = None  # named explicitly: linted even if it does not end in .py (read_source refuses a FIFO)
            continue
        for dirpath, dirnames, filenames in os.walk(p):
            dirnames[:] = sorted(
                d for d in dirnames if d not in SKIP_DIRS and not _excluded(Path(dirpath, d), cfg, cwd)
            )
            for name in filenames:
                if name.endswith(".py"):
                    f = Path(dirpath, name)
                    if not _excluded(f, cfg, cwd):
                        found.setdefault(f, p)
    return dict(sorted(found.items()))


_pkg_cache: dict[Path, bool] = {}


def module_name(p: Path, root: Path | None = None) -> str:
    """Dotted module name, climbing while the directory is a package, and through the directories
    below ROOT (the directory linted) even without `__init__.py`: namespace packages (PEP 420), as
    in SGLang's tree, where `sglang.srt.disaggregation.utils` has no `__init__.py` on its way
    (it becomes `disaggregation.utils`, which imports of the full name match by suffix)."""
    parts = [] if p.name == "__init__.py" else [p.stem]
    d = p.parent
    while True:
        is_pkg = _pkg_cache.get(d)
        if is_pkg is None:
            is_pkg = _pkg_cache[d] = (d / "__init__.py").is_file()
        below = root is not None and root in d.parents  # strictly below the directory linted
        if not (is_pkg or below):
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
    """A file's summary; with a cache, as (cache entry name, the pickled summary): the worker pickles it
    once, the parent keeps those bytes for the run's pack and unpickles them for the project."""
    file, path, modname = job
    sm = summarize_file(file, path, modname, _STATE["cfg"])
    if _STATE.get("cache") is not None and sm.error is None:
        return _Entry("p1-" + digest(_STATE["analysis"], sm.path, sm.modname, sm.digest), _pickled(sm))
    return sm


def _pass2(job: tuple):
    file, path, modname = job
    result = check_file(file, path, modname, _STATE["cfg"], _STATE["project"])
    sm = _STATE["project"].modules[path]
    if _STATE.get("cache") is not None and result.error is None and result.digest == sm.digest:
        return path, _Entry(_pass2_name(_STATE["analysis"], _STATE["cfg"], sm), _pickled(result))
    return path, result


@dataclass
class _Entry:
    name: str
    data: bytes


def _pickled(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _kept(value, made: dict):
    """A worker's result, its cache entry noted in MADE (name -> bytes) for the run's pack."""
    if isinstance(value, _Entry):
        made[value.name] = value.data
        return pickle.loads(value.data)
    return value


def _map(fn, jobs: list, workers: int, bar=None) -> list:
    """fn over jobs, results in the order of JOBS; `bar` (hctool.console.progress) advances once a file.
    In parallel the largest files go first and results come back as they are done: in path order, a
    chunk of large files near the end (server_args.py in SGLang's srt) kept a worker busy alone while
    the other idled, and a chunk in order waited on its slowest file."""

    if workers <= 1 or len(jobs) < PARALLEL_MIN_FILES or "fork" not in multiprocessing.get_all_start_methods():
        out = []
        for j in jobs:
            out.append(fn(j))
            if bar is not None:
                bar.update(advance=1)
        return out
    out = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: -_size(jobs[i][0]))
    _STATE["fn"] = fn
    with multiprocessing.get_context("fork").Pool(workers, initializer=_worker_signals) as pool:
        # Chunks of a sixteenth of a worker's share: the last ones hold the smallest files.
        chunk = max(1, len(jobs) // (workers * 16))
        for i, res in pool.imap_unordered(_indexed, [(i, jobs[i]) for i in order], chunksize=chunk):
            out[i] = res
            if bar is not None:
                bar.update(advance=1)
    return out


def _indexed(task: tuple) -> tuple:
    i, job = task
    return i, _STATE["fn"](job)


def _size(file: str) -> int:
    try:
        return os.stat(file).st_size
    except OSError:
        return 0


def _worker_signals() -> None:
    """A worker ends quietly when the pool is closed (SIGTERM): the handler it inherited from the
    command turns that into a KeyboardInterrupt traceback on stderr after every parallel run."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes the pool


def lint(
    paths: list[Path],
    cfg: LintConfig,
    jobs: int | None = None,
    cwd: Path | None = None,
    progress=None,
    cache_dir: Path | None = None,
) -> Report:
    """Lint PATHS. With CACHE_DIR, reuse and store per-file results there (cache.py)."""
    # The analysis builds millions of small objects and few cycles: the cyclic collector would spend
    # half the run scanning them (measured on SGLang's srt). Reference counting frees the rest.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint(paths, cfg, jobs, cwd, progress, cache_dir)
    finally:
        if enabled:
            gc.enable()


def _lint(paths: list[Path], cfg: LintConfig, jobs: int | None, cwd: Path | None, progress, cache_dir) -> Report:
    with hprogress.task("lint", total=None, text="finding files") as bar:  # a terminal only (hctool.console.progress)
        return _lint_files(paths, cfg, jobs, cwd, progress, cache_dir, bar)


def _lint_files(
    paths: list[Path], cfg: LintConfig, jobs: int | None, cwd: Path | None, progress, cache_dir, bar
) -> Report:
    cwd = (cwd or Path.cwd()).resolve()
    started = time.perf_counter()
    files = discover(paths, cfg, cwd)
    workers = jobs or os.cpu_count() or 1
    job_list = [(str(f), _display(f, cwd), module_name(f, root)) for f, root in files.items()]
    cache = Cache(cache_dir) if cache_dir is not None else None
    analysis = (sorted(cfg.collectives), sorted(cfg.rank_local), sorted(cfg.uniform))
    if cache is not None:  # what the files hold now; workers key what they store by what they read
        digests = [_file_digest(file) for file, _, _ in job_list]
        run_name = "run-" + digest(analysis, sorted(cfg.select), [(j[1], j[2], d) for j, d in zip(job_list, digests)])
        hit = cache.get(run_name)
        if isinstance(hit, Report):  # nothing changed since a run that gave this report
            hit.root, hit.seconds, hit.analyzed = (
                find_root(cwd),
                time.perf_counter() - started,
                {"pass1": 0, "pass2": 0},
            )
            return hit
    _STATE.update(cfg=cfg, cache=cache, analysis=analysis)
    summaries: list = [None] * len(job_list)
    todo = list(range(len(job_list)))
    if cache is not None:
        names = ["p1-" + digest(analysis, j[1], j[2], d) for j, d in zip(job_list, digests)]
        summaries = [cache.get(n) for n in names]
        todo = [i for i, sm in enumerate(summaries) if not isinstance(sm, ModuleSummary)]
    fresh = len(todo)
    if progress:
        progress(f"pass 1: summarizing {fresh} of {len(files)} files")
    bar.update(completed=0, total=fresh, text="pass 1: files summarized")
    made: dict[str, bytes] = {}  # cache entries this run makes: one pack at the end
    for i, sm in zip(todo, _map(_pass1, [job_list[i] for i in todo], workers, bar)):
        summaries[i] = _kept(sm, made)
    project = Project(summaries)
    _STATE["project"] = project
    report = Report(files=len(files), lines=sum(sm.lines for sm in summaries), root=find_root(cwd))
    wanted = [i for i, sm in enumerate(summaries) if sm.error is None and project.module_has_collectives(sm)]
    results: dict = {}
    for i in wanted if cache is not None else ():
        sm = summaries[i]
        hit = cache.get(_pass2_name(analysis, cfg, sm))
        if (
            isinstance(hit, FileResult)
            and hit.walked == walked(project, [f.key for f in sm.funcs])
            and hit.program == project.program_has_collectives(sm.modname)
            and still_valid(project, hit.answers)
        ):
            results[i] = hit  # what the file asked of the project is answered the same way: reuse
    todo = [i for i in wanted if i not in results]
    if progress:
        progress(
            f"pass 2: checking {len(todo)} of {len(wanted)} files with collectives "
            f"({len(project.coll)} collective sites)"
        )
    bar.update(completed=0, total=len(todo), text="pass 2: files with collectives checked")
    for i, (_path, result) in zip(todo, _map(_pass2, [job_list[i] for i in todo], workers, bar)):
        results[i] = _kept(result, made)
    for sm in summaries:
        if sm.error:
            report.errors.append(FileError(sm.path, *sm.error))
    relations, used = [], {}
    for i in wanted:
        result = results[i]
        relations += result.relations
        used[summaries[i].path] = set(result.used)
        if result.error:
            report.errors.append(FileError(summaries[i].path, *result.error))
    report.findings = findings(relations, project, summaries, used, cfg, {d: f for f, d, _ in job_list})
    report.errors.sort(key=lambda e: (e.path, e.line))
    report.analyzed = {"pass1": fresh, "pass2": len(todo)}
    report.seconds = time.perf_counter() - started
    _STATE.clear()
    if cache is not None:
        cache.put_pack(made)
        if not report.errors:
            cache.put(run_name, report)
    return report


def _pass2_name(analysis: tuple, cfg: LintConfig, sm: ModuleSummary) -> str:
    return "p2-" + digest(analysis, sorted(cfg.select), sm.path, sm.modname, sm.digest)


def _file_digest(file: str) -> str:
    try:
        return digest(read_source(file))
    except OSError:
        return ""


def findings(
    relations: list, project: Project, summaries: list, used: dict, cfg: LintConfig, files: dict | None = None
) -> list:
    """Pass 3: the calls of polls that hide a collective join the relations; one finding per root cause;
    suppressions on a finding's own line; unused suppressions (HC100)."""
    tables = {s.path: s.suppressions for s in summaries if s.suppressions}
    if "HC102" in cfg.select:
        for r in gated_callers(relations, project, summaries):
            table = tables.get(r.path)
            relations += suppress([r], table, used.setdefault(r.path, set())) if table else [r]
    # A pool's free count differs between ranks only where some rank frees it at a time of its own.
    lagging = project.lagging_pools()
    relations = [r for r in relations if not (r.src is not None and r.src.kind == "pool" and not _lags(r.src, lagging))]
    out = []
    for f in fold(relations, lagging):
        table = tables.get(f.path, {})
        codes = {f.rule} | {rel.message.split(":", 1)[0] for rel in f.related if rel.role == "collective"}
        hit = table.get(f.line)
        if hit and codes & hit[1]:
            used.setdefault(f.path, set()).update((f.line, c) for c in codes & hit[1])
            continue
        out.append(f)
    out = _drop_unbuilt(out, summaries, files or {s.path: s.path for s in summaries})
    if "HC100" in cfg.select:
        for path, table in sorted(tables.items()):
            out += unused_suppressions(path, table, used.get(path, set()), cfg.select)
    return sorted(out)


def _drop_unbuilt(found: list, summaries: list, files: dict) -> list:
    """Findings whose source is a method of a class the tree names only as a type (unbuilt.py) describe
    code that never runs: left out, and said so on stderr."""
    classes_of = {s.path: s.classes for s in summaries}
    owner = {}
    for f in found:
        head = f.function.split(".", 1)[0]
        if "." in f.function and head in classes_of.get(f.path, {}):
            owner[id(f)] = (f.path, head)
    dead = unbuilt(set(owner.values()), {s.path: files.get(s.path, s.path) for s in summaries})
    for path, name in sorted(dead):
        log.info(f"no findings in {path}'s {name}: the tree names it only as a type and never builds one")
    return [f for f in found if owner.get(id(f)) not in dead]


def _lags(src, lagging: dict) -> bool:
    pool = S.free_count_pool(src.what)
    return pool is None or pool in lagging


def stderr_progress(message: str) -> None:
    log.info(message)
