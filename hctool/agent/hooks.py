"""The agent's one import hook: run callbacks right after a module is executed, without
importing it early (the recorder waits for torch.distributed, faults and probes for the
modules they name). Callbacks never break the import: a failure is one stderr line."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending: dict[str, list[Callable]] = {}
        self.lock = threading.RLock()
        self.busy: set[str] = set()  # names being looked up by us: every other finder answers

    def find_spec(self, fullname, path, target=None):
        with self.lock:
            if fullname not in self.pending or fullname in self.busy:
                return None
            self.busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, original = spec.loader, spec.loader.exec_module

        def exec_module(module):
            original(module)
            with self.lock:
                callbacks = self.pending.pop(fullname, [])
            for callback in callbacks:
                _run(callback, module)

        loader.exec_module = exec_module
        return spec


_HOOK = _AfterImport()


def _run(callback: Callable, module) -> None:
    try:
        callback(module)
    except Exception as exc:
        try:
            sys.stderr.write(f"hctool: hook on {module.__name__} failed: {type(exc).__name__}: {exc}\n")
        except Exception:
            pass


def when_imported(name: str, callback: Callable) -> None:
    """callback(module) once `name` has been executed (now, if it already has)."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        _run(callback, module)
        return
    with _HOOK.lock:
        _HOOK.pending.setdefault(name, []).append(callback)
        if _HOOK not in sys.meta_path:
            sys.meta_path.insert(0, _HOOK)
