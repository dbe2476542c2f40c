"""Every HCTOOL_* environment variable, in one place. The supervisor sets them on the ranks it
starts (hctool.supervise.procs.inject_env); the agent reads them. The engine's own variables (its
process contract) are the engine's: engine/lab/contract.py."""

TRACE_DIR = "HCTOOL_TRACE_DIR"  # turn the collective recorder on; traces go here
RUN_ID = "HCTOOL_RUN_ID"  # the run that claimed the trace folder (hctool/supervise/runlock.py); in each trace's header
FAULTS = "HCTOOL_FAULTS"  # ';'-joined fault specs (faults.py)
FAULTS_T0 = "HCTOOL_FAULTS_T0"  # file holding "T0 [HEAL_S]": when the fault clock starts / heals
PROBES = "HCTOOL_PROBES"  # ','-joined probes: `pkg.mod:Qual.name` functions, modules or .py files
SUPERVISOR_PID = "HCTOOL_SUPERVISOR_PID"  # the hctool whose death the rank follows (agent/lifeline.py)
ROLE = "HCTOOL_ROLE"  # PD side of an engine rank (prefill | decode | null), for faults
RUN_DIR = "HCTOOL_RUN_DIR"  # the run folder of an engine topology
CHAOS_DIR = "HCTOOL_CHAOS_DIR"  # where the chaos observer writes its evidence
CHAOS_STARVE_TICKS = "HCTOOL_CHAOS_STARVE_TICKS"  # ticks of waiting-with-nothing-running that count as starved
C10D_KERNEL = "HCTOOL_C10D_KERNEL"  # path of the built C++ capture kernel, or 0 (off)
FASTPATH = "HCTOOL_FASTPATH"  # 0: the recorder's C hot path is off
CACHE_DIR = "HCTOOL_CACHE_DIR"  # build, lint and chaos caches (default ~/.cache/hctool; off: none)
DEBUG = "HCTOOL_DEBUG"  # 1: internal errors print their traceback
ANALYZE_COLUMNS = "HCTOOL_ANALYZE_COLUMNS"  # 0: the analyzer reads every call as an event (no column fast path)
KEEP_RUNS = "HCTOOL_KEEP_RUNS"  # run folders kept per command in ./hctool-runs (hctool/console/runs.py; 0: all)

ALL = (
    TRACE_DIR,
    RUN_ID,
    FAULTS,
    FAULTS_T0,
    PROBES,
    SUPERVISOR_PID,
    ROLE,
    RUN_DIR,
    CHAOS_DIR,
    CHAOS_STARVE_TICKS,
    C10D_KERNEL,
    FASTPATH,
    CACHE_DIR,
    DEBUG,
    ANALYZE_COLUMNS,
    KEEP_RUNS,
)


def cache_root():
    """The folder of hctool's caches (HCTOOL_CACHE_DIR, default ~/.cache/hctool), or None where
    HCTOOL_CACHE_DIR=off: nothing is cached then."""
    import os
    from pathlib import Path

    where = os.environ.get(CACHE_DIR, "")
    if where == "off":
        return None
    return Path(where) if where else Path.home() / ".cache" / "hctool"
