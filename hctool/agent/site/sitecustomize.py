"""hctool's injection point, loaded by every Python process started with
hctool/agent/site first on PYTHONPATH (see hctool.supervise.procs.inject_env). Nothing
else lives in this folder: every file here shadows a top-level module of the
user's program (`import faults` must find theirs, not ours).

Reads HCTOOL_TRACE_DIR (collective recorder), HCTOOL_FAULTS (fault injection)
and HCTOOL_PROBES (function probes, or modules / .py files to import); the rest
of the agent (hctool/agent) does the work. It must never break the program: a
failure prints one line to stderr and the program goes on, except for faults: a
run without its faults would give a verdict about something else, so a process
whose faults cannot be installed exits (code 2) after saying why.
torch is not imported here; the recorder hooks the first import of
torch.distributed instead (importing torch costs ~1-3 s per process).
"""

import os
import sys


def _warn(what, exc):
    try:
        sys.stderr.write(f"hctool: {what} failed: {type(exc).__name__}: {exc}\n")
    except Exception:
        pass


def _here():
    return os.path.dirname(os.path.abspath(__file__))


def _ensure_hctool_importable():
    # hctool/agent/site/ -> the folder holding the hctool package.
    root = os.path.dirname(os.path.dirname(os.path.dirname(_here())))
    try:
        import hctool  # noqa: F401
    except ImportError:
        sys.path.append(root)


def _chain_shadowed_sitecustomize():
    """Run the next sitecustomize on sys.path, which ours shadows."""
    import importlib.machinery
    import importlib.util

    here = _here()
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.origin is None or os.path.dirname(os.path.abspath(spec.origin)) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _main():
    try:
        _chain_shadowed_sitecustomize()
    except Exception as exc:
        _warn("chaining to the shadowed sitecustomize", exc)
    env = os.environ
    if env.get("HCTOOL_SUPERVISOR_PID"):  # exit with the hctool that started us (lifeline.py)
        try:
            _ensure_hctool_importable()
            from hctool.agent import lifeline

            lifeline.install_from_env(env)
        except Exception as exc:
            _warn("watching the supervising hctool", exc)
    if not (env.get("HCTOOL_TRACE_DIR") or env.get("HCTOOL_FAULTS") or env.get("HCTOOL_PROBES")):
        return
    try:
        _ensure_hctool_importable()
    except Exception as exc:
        _warn("locating hctool", exc)
        return
    if env.get("HCTOOL_TRACE_DIR"):
        try:
            from hctool.agent.capture import install

            install.install_on_import(env["HCTOOL_TRACE_DIR"])
        except Exception as exc:
            _warn("installing the collective recorder", exc)
    if env.get("HCTOOL_FAULTS"):
        try:
            from hctool.agent import faults

            faults.install_from_env()
        except Exception as exc:
            _warn(f"installing faults {env['HCTOOL_FAULTS']!r} (the process exits rather than run without them)", exc)
            sys.stderr.flush()
            os._exit(2)
    if env.get("HCTOOL_PROBES"):
        try:
            from hctool.agent import probes

            probes.install_from_env()
        except Exception as exc:
            _warn("installing probes", exc)


_main()
