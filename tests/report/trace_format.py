"""A checker of the Chrome Trace Event Format (the JSON Object Format of
Google's "Trace Event Format" document, as chrome://tracing and Perfetto read it),
written from the format's rules, not from our exporter: an exported file that
breaks one of them would draw wrong or not at all in a viewer."""

from __future__ import annotations

from collections import defaultdict

PHASES = {"B", "E", "X", "i", "I", "s", "t", "f", "M", "C", "b", "e", "n"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index", "process_labels"}


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check(doc: dict) -> list[str]:
    """Every rule broken, as text (empty: a well-formed trace)."""
    errs: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    evs = doc["traceEvents"]
    proc_names, thread_names = set(), set()
    used_pids, used_tracks = set(), set()
    open_b: dict = defaultdict(list)
    slices: dict = defaultdict(list)  # (pid, tid) -> [(start, end)]
    flows: dict = defaultdict(list)
    for i, e in enumerate(evs):
        where = f"event {i} ({e.get('ph')} {e.get('name')!r})"
        ph = e.get("ph")
        if ph not in PHASES:
            errs.append(f"{where}: unknown ph")
            continue
        if not isinstance(e.get("name"), str):
            errs.append(f"{where}: name is not a string")
        if not (isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int)):
            errs.append(f"{where}: pid and tid must be integers")
            continue
        key = (e["pid"], e["tid"])
        if ph == "M":
            if e["name"] not in METADATA:
                errs.append(f"{where}: unknown metadata name")
            if e["name"] == "process_name":
                proc_names.add(e["pid"])
            if e["name"] == "thread_name":
                thread_names.add(key)
            if not isinstance(e.get("args"), dict):
                errs.append(f"{where}: metadata without args")
            continue
        if not _num(e.get("ts")) or e["ts"] < 0:
            errs.append(f"{where}: ts must be a number >= 0")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            errs.append(f"{where}: args must be an object")
        global_instant = ph in ("i", "I") and e.get("s") == "g"
        if not global_instant:
            used_pids.add(e["pid"])
            if not (ph in ("i", "I") and e.get("s") == "p"):
                used_tracks.add(key)
        if ph == "X":
            if not _num(e.get("dur")) or e["dur"] < 0:
                errs.append(f"{where}: X without a dur >= 0")
            else:
                slices[key].append((e["ts"], e["ts"] + e["dur"], i))
        elif ph == "B":
            open_b[key].append(e)
        elif ph == "E":
            if not open_b[key]:
                errs.append(f"{where}: E without its B")
            else:
                open_b[key].pop()
        elif ph in ("i", "I"):
            if e.get("s", "t") not in ("g", "p", "t"):
                errs.append(f"{where}: instant scope must be g, p or t")
        elif ph in ("s", "t", "f"):
            if "id" not in e:
                errs.append(f"{where}: flow event without id")
            else:
                flows[(e.get("cat"), e.get("name"), e["id"])].append(e)
    for key, stack in open_b.items():
        for e in stack:
            errs.append(f"B {e.get('name')!r} on {key} has no E")
    for key, spans in slices.items():  # on one track slices nest or are disjoint
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list = []
        for start, end, i in spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-6:
                errs.append(f"slice {i} on {key} overlaps slice {stack[-1][2]} without nesting")
            stack.append((start, end, i))
    for pid in used_pids - proc_names:
        errs.append(f"pid {pid} has no process_name")
    for key in used_tracks - thread_names:
        errs.append(f"track {key} has no thread_name")
    for key, group in flows.items():
        phases = sorted(e["ph"] for e in group)
        if phases.count("s") != 1 or phases.count("f") != 1:
            errs.append(f"flow {key}: wants one s and one f, has {phases}")
            continue
        for e in group:  # a flow binds to the slice around its ts on its track
            spans = slices.get((e["pid"], e["tid"]), [])
            if not any(s <= e["ts"] <= t for s, t, _ in spans):
                errs.append(f"flow {key} {e['ph']} at {e['ts']} on {(e['pid'], e['tid'])} lies in no slice")
    return errs
