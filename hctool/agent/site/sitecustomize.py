"""hctool's injection point, loaded by every Python process started with
hctool/inject/site first on PYTHONPATH (see hctool.procs.inject_env). Nothing
else lives in this folder: every file here shadows a top-level module of the
user's program (`import faults` must find theirs, not ours).

Reads HCTOOL_TRACE_DIR (collective recorder), HCTOOL_FAULTS (fault injection)
and HCTOOL_PROBES (modules or .py files to import). It must never break the
program: a failure prints one line to stderr and the program goes on, except
for faults: a scenario run without its faults would give a verdict about
something else, so a process whose faults cannot be installed exits (code 2)
after saying why.
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
    # hctool/inject/site/ -> the folder holding the hctool package.
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


def _import_probe(name):
    import importlib
    import importlib.util

    if name.endswith(".py"):
        mod_name = "hctool_probe_" + os.path.splitext(os.path.basename(name))[0]
        spec = importlib.util.spec_from_file_location(mod_name, name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        importlib.import_module(name)


def _main():
    try:
        _chain_shadowed_sitecustomize()
    except Exception as exc:
        _warn("chaining to the shadowed sitecustomize", exc)
    env = os.environ
    if env.get("HCTOOL_SUPERVISOR_PID"):  # exit with the hctool that started us (lifeline.py)
        try:
            _ensure_hctool_importable()
            from hctool.inject import lifeline

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
            from hctool.consensus import recorder

            recorder.install_on_import(env["HCTOOL_TRACE_DIR"])
        except Exception as exc:
            _warn("installing the collective recorder", exc)
    if env.get("HCTOOL_FAULTS"):
        try:
            from hctool.inject import faults

            faults.install_from_env()
        except Exception as exc:
            _warn(f"installing faults {env['HCTOOL_FAULTS']!r} (the process exits rather than run without them)", exc)
            sys.stderr.flush()
            os._exit(2)
    for name in filter(None, (p.strip() for p in env.get("HCTOOL_PROBES", "").split(","))):
        try:
            _import_probe(name)
        except Exception as exc:
            _warn(f"importing probe {name}", exc)


_main()
