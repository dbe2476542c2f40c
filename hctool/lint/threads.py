"""Fields another thread writes: a rank-local source whatever value is written, since when the write
lands is each rank's own timing (a prefetch worker's hit count, a transfer thread's request status).

A function runs on another thread when it is handed to one (`threading.Thread(target=f)`,
`Timer(t, f)`, `executor.submit(f)`, `loop.run_in_executor(ex, f)`, `future.add_done_callback(f)`),
and so does what it calls, up to THREAD_DEPTH calls down: deeper, a thread's callees are mostly
helpers shared with the main thread, and their writes are the main thread's too.
"""

from __future__ import annotations

from collections import deque

from hctool.lint.shapes import Src

THREAD_DEPTH = 2


def thread_functions(project) -> dict[str, str]:
    """{function key: qualified name of the thread entry it runs under}."""
    out: dict[str, str] = {}
    queue = deque()
    for key in sorted(project.funcs):
        for ref, _line in project.funcs[key].spawns:
            for target in project.resolve(ref):
                if target not in out:
                    out[target] = project.funcs[target].qual
                    queue.append((target, 0))
    while queue:
        key, depth = queue.popleft()
        if depth >= THREAD_DEPTH:
            continue
        for ref, *_rest in project.funcs[key].calls:
            if ref[0] not in ("self", "super", "local", "key"):  # the thread's own object and module
                continue
            for target in project.resolve(ref):
                if target not in out and not target.endswith(".__init__"):
                    out[target] = out[key]
                    queue.append((target, depth + 1))
    return out


def thread_writes(project) -> tuple[dict, dict]:
    """({(module, class, field): Src} for fields of typed objects, {field: Src} for untyped ones)."""
    typed: dict = {}
    loose: dict = {}
    for key, entry in sorted(thread_functions(project).items()):
        f = project.funcs[key]
        for specs, name, line in f.writes:
            if specs is None:
                what, cids = f"`self.{name}`", [f.cid] if f.cid else []
            elif specs == "loose":  # NAME may carry `@items_field` (observe._loose_key): shown without it
                what, cids = f"field `{name.split('@', 1)[0]}`", None
            else:
                what, cids = f"field `{name}`", project.classes_of(specs)
            src = Src("thread", f"{what} (assigned on the thread that runs `{entry}`)", f.path, line, 0, 1, f.qual)
            if cids is None:
                if name not in loose or src < loose[name]:
                    loose[name] = src
            for cid in cids or ():
                k = (*cid, name)
                if k not in typed or src < typed[k]:
                    typed[k] = src
    return typed, loose
