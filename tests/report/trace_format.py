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


PROCESS_METADATA = {"process_name", "process_sort_index", "process_labels"}  # their tid means nothing


def check(doc: dict) -> list[str]:
    """Every rule broken, as text (empty: a well-formed trace)."""
    errs: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents list"]
    evs = doc["traceEvents"]
    proc_names, thread_names = set(), defaultdict(list)  # (pid, tid) -> its thread_name values
    used_pids, used_tracks = set(), set()
    tid_pids: dict = defaultdict(set)  # tid -> the pids whose threads carry it
    open_b: dict = defaultdict(list)
    slices: dict = defaultdict(list)  # (pid, tid) -> [(start, end)]
    flows: dict = defaultdict(list)
    bound: dict = defaultdict(list)  # bind_id -> the X/B events that start (flow_out) or end (flow_in) it
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
                thread_names[key].append((e.get("args") or {}).get("name"))
            if e["name"] not in PROCESS_METADATA:
                tid_pids[e["tid"]].add(e["pid"])
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
                tid_pids[e["tid"]].add(e["pid"])
        if ph in ("X", "B") and "bind_id" in e:  # the newer flow form: slices bound by id
            if e.get("flow_out"):
                bound[e["bind_id"]].append(("out", e, i))
            if e.get("flow_in"):
                bound[e["bind_id"]].append(("in", e, i))
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
    for key in used_tracks - set(thread_names):
        errs.append(f"track {key} has no thread_name")
    for key, names in thread_names.items():
        if len(names) != 1:
            errs.append(f"track {key} has {len(names)} thread_name events: {names}")
    by_name: dict = defaultdict(list)  # (pid, thread name) -> its tracks: one name, one track
    for (pid, tid), names in thread_names.items():
        for name in set(names):
            by_name[(pid, name)].append(tid)
    for (pid, name), tids in by_name.items():
        if len(tids) > 1:
            errs.append(f"pid {pid}: thread name {name!r} on tids {sorted(tids)}")
    # A viewer keys a thread by its tid (Perfetto's JSON importer moves a tid seen in a second
    # pid into that process): a tid belongs to one process.
    for tid, pids in tid_pids.items():
        if len(pids) > 1:
            errs.append(f"tid {tid} is used by pids {sorted(pids)}")
    ids: dict = defaultdict(set)  # one id, one flow: viewers differ in whether name and cat key it
    for cat, name, fid in flows:
        ids[fid].add((cat, name))
    for fid, keys in ids.items():
        if len(keys) > 1:
            errs.append(f"flow id {fid} is shared by {sorted(map(str, keys))}")
    for fid, ends in bound.items():
        outs = [e for side, e, _ in ends if side == "out"]
        ins = [e for side, e, _ in ends if side == "in"]
        if len(outs) != 1 or not ins:
            errs.append(f"bind_id {fid}: wants one flow_out and a flow_in, has {len(outs)} and {len(ins)}")
        elif any(e["ts"] < outs[0]["ts"] for e in ins):
            errs.append(f"bind_id {fid}: a flow_in slice starts before its flow_out slice")
    for key, group in flows.items():
        phases = sorted(e["ph"] for e in group)
        if phases.count("s") != 1 or phases.count("f") != 1:
            errs.append(f"flow {key}: wants one s and one f, has {phases}")
            continue
        # Importers read events in time order and drop a step or end whose start they have not
        # seen: s, then any t, then f, never going back in time.
        order = {"s": 0, "t": 1, "f": 2}
        walk = sorted(group, key=lambda e: order[e["ph"]])
        if any(b["ts"] < a["ts"] for a, b in zip(walk, walk[1:])):
            errs.append(f"flow {key}: goes back in time ({[(e['ph'], e['ts']) for e in walk]})")
        for e in group:  # a flow binds to the slice around its ts on its track
            spans = slices.get((e["pid"], e["tid"]), [])
            if not any(s <= e["ts"] <= t for s, t, _ in spans):
                errs.append(f"flow {key} {e['ph']} at {e['ts']} on {(e['pid'], e['tid'])} lies in no slice")
    return errs
