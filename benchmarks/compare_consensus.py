"""check-consensus next to PyTorch's own desync tools, on one corpus.

For each case (a 2-rank program, divergent or its clean twin) and each tool:
  hctool   `hctool check-consensus run --json -- torchrun --standalone --nproc-per-node 2 PROG`
  detail   TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun ...
  desync   TORCH_NCCL_DESYNC_DEBUG=1 torchrun ...          (NCCL only: --gpu; with fr's settings)
  fr       Flight Recorder: TORCH_FR_BUFFER_SIZE + dump on timeout, then `hctool check-consensus
           analyze` of the dumps (none appear before the collective timeout unless the program dumps)
  plain    torchrun alone, clean twins only (the baseline for cost)
records what the tool names (culprit rank, call site), seconds from start to
that, and the clean twin's wall time against plain. Every job is killed at
--timeout. CPU corpus: tests/consensus/programs (gloo). --gpu: pytorch/examples
DDP and FSDP2 taken from --examples at run time, with divergent copies made by
patching one line (written under --work, never into the repo).

  python benchmarks/compare_consensus.py --out results.json [--gpu --examples DIR] [--tools hctool,detail]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "tests" / "consensus" / "programs"
# What each tool prints when it names a divergence (first match counts).
NAMES = {
    "detail": re.compile(
        r"(Detected mismatch between collectives on ranks[^\n]*|check rank \d+ logs for faulty rank"
        r"|Ranks? [\d, ]+ failed to pass monitoredBarrier[^\n]*"
        r"|collective operation mismatch[^\n]*|mismatch[^\n]{0,160})",
        re.I,
    ),
    "desync": re.compile(
        r"(Desync debug report[^\n]*|\[Rank \d+\][^\n]*(?:not joined|never joined|missing)[^\n]*"
        r"|ranks? [\d, ]+ (?:did not|have not) join[^\n]*)",
        re.I,
    ),
}


def cpu_cases() -> list[dict]:
    def prog(name, culprit, fix=False, args=()):
        env = {"PROG_FIX": "1"} if fix else {}
        return {
            "name": name + (" (clean)" if fix else ""),
            "cmd": [str(PROGRAMS / name), *args],
            "env": env,
            "culprit": None if fix else culprit,
            "clean": fix,
        }

    out = []
    for name, culprit in (
        ("ddp_train.py", [1]),
        ("extra_same_shape.py", [0]),
        ("outside_collective.py", [1]),
        ("subgroup_pairs.py", [0]),
    ):
        out += [prog(name, culprit), prog(name, culprit, fix=True)]
    return out


def gpu_cases(examples: Path, work: Path) -> list[dict]:
    """pytorch/examples at run time; divergent copies by a one-line patch."""
    ddp_src = examples / "ddp-tutorial-series"
    fsdp_src = examples / "FSDP2"

    def copy(src: Path, name: str, patch: tuple[str, str] | None) -> Path:
        dst = work / name
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.glob("*.py"):
            text = f.read_text()
            if patch and patch[0] in text:
                text = text.replace(patch[0], patch[1], 1)
            (dst / f.name).write_text(text)
        return dst

    uneven = (
        "            self._run_batch(source, targets)\n",
        "            self._run_batch(source, targets)\n"
        "        if self.gpu_id == 1 and epoch == 2:  # uneven inputs: one batch more on rank 1\n"
        "            self._run_batch(source, targets)\n",
    )
    extra_ar = (
        "            self._run_batch(source, targets)\n",
        "            self._run_batch(source, targets)\n"
        "        if self.gpu_id == 1 and epoch == 2:  # one extra same-shape all_reduce on rank 1\n"
        "            torch.distributed.all_reduce(torch.zeros(21, device=self.gpu_id))\n",
    )
    fsdp_extra = (
        "    for _ in range(10):\n",
        "    for _ in range(10 + (1 if rank == 1 else 0)):  # rank 1: one step more\n",
    )
    cases = [
        {
            "name": "ddp multigpu_torchrun (clean)",
            "dir": copy(ddp_src, "ddp", None),
            "cmd": ["multigpu_torchrun.py", "5", "10"],
            "culprit": None,
            "clean": True,
        },
        {
            "name": "ddp uneven inputs",
            "dir": copy(ddp_src, "ddp_uneven", uneven),
            "cmd": ["multigpu_torchrun.py", "5", "10"],
            "culprit": [1],
        },
        {
            "name": "ddp extra all_reduce",
            "dir": copy(ddp_src, "ddp_extra", extra_ar),
            "cmd": ["multigpu_torchrun.py", "5", "10"],
            "culprit": [1],
        },
        {
            "name": "fsdp2 example (clean)",
            "dir": copy(fsdp_src, "fsdp2", None),
            "cmd": ["example.py"],
            "culprit": None,
            "clean": True,
        },
        {
            "name": "fsdp2 extra step",
            "dir": copy(fsdp_src, "fsdp2_extra", fsdp_extra),
            "cmd": ["example.py"],
            "culprit": [1],
        },
    ]
    for c in cases:
        c["cmd"] = [str(c["dir"] / c["cmd"][0]), *c["cmd"][1:]]
        c.setdefault("env", {})
    return cases


def _run(cmd: list[str], env: dict, cwd: Path, timeout: float, pattern: re.Pattern | None) -> dict:
    """Run a job in its own session; kill it at timeout. Returns wall time, exit
    code, the first line matching pattern and when it appeared."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    out: list[str] = []
    first: dict = {}

    def pump():
        for line in proc.stdout:
            out.append(line)
            if pattern is not None and not first and pattern.search(line):
                first.update(line=pattern.search(line).group(0)[:240], at_s=round(time.monotonic() - start, 2))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out, code = True, None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole job, also on success (stray ranks)
        except ProcessLookupError:
            pass
        proc.wait()
        reader.join(timeout=5)
    return {
        "wall_s": round(time.monotonic() - start, 2),
        "exit": code,
        "timed_out": timed_out,
        "first": first or None,
        "output": "".join(out),
    }


def run_tool(tool: str, case: dict, timeout: float, hang_after: float, scratch: Path) -> dict:
    env = dict(os.environ, **case.get("env", {}))
    env.pop("HCTOOL_TRACE_DIR", None)
    cwd = Path(tempfile.mkdtemp(dir=scratch, prefix=tool + "-"))  # examples write snapshots in cwd
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *case["cmd"]]
    if case.get("dir"):
        env["PYTHONPATH"] = f"{case['dir']}:{env.get('PYTHONPATH', '')}"
    if tool == "hctool":
        env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
        cmd = [
            sys.executable,
            "-m",
            "hctool",
            "check-consensus",
            "run",
            "--json",
            "--hang-after",
            str(hang_after),
            "--timeout",
            str(timeout - 5),
            "--trace-dir",
            str(cwd / "trace"),
            "--",
            *torchrun,
        ]
        r = _run(cmd, env, cwd, timeout + 30, re.compile(r"hctool: (diverged|hung|crashed): [^\n]*"))
        m = re.search(r"^\{.*^\}", r["output"], re.S | re.M)
        report = json.loads(m.group(0)) if m else {}
        first = report.get("first_divergence") or {}
        culprits = first.get("culprit_ranks")
        sites = {r_: e.get("site") for r_, e in (first.get("ranks") or {}).items() if int(r_) in (culprits or [])}
        lat = re.search(r"reported (\d+) ms after", r["output"])
        return {
            "verdict": report.get("verdict"),
            "names": culprits,
            "kind": first.get("kind"),
            "sites": sites,
            "counts": report.get("counts"),
            "named_at_s": (r["first"] or {}).get("at_s"),
            "latency_ms": int(lat.group(1)) if lat else None,
            "wall_s": r["wall_s"],
            "exit": r["exit"],
        }
    if tool == "detail":
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if tool == "desync":
        env["TORCH_NCCL_DESYNC_DEBUG"] = "1"
    if tool in ("fr", "desync"):  # one NCCL run serves both: FR dumps when the desync report does
        env.update(
            TORCH_FR_BUFFER_SIZE="2000",
            TORCH_FR_DUMP_TEMP_FILE=str(cwd / "fr_rank"),
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_INCLUDE_STACK_TRACE="1",
        )
    r = _run(torchrun, env, cwd, timeout, NAMES.get(tool))
    out = {
        "wall_s": r["wall_s"],
        "exit": r["exit"],
        "timed_out": r["timed_out"],
        "first": r["first"],
        "tail": r["output"][-1200:],
    }
    if tool in ("fr", "desync"):
        dumps = sorted(p.name for p in cwd.glob("fr_rank*"))
        out["dumps"] = dumps
        if dumps:
            env2 = dict(os.environ, PYTHONPATH=str(REPO))
            a = subprocess.run(
                [sys.executable, "-m", "hctool", "check-consensus", "analyze", "--json", str(cwd)],
                capture_output=True,
                text=True,
                env=env2,
                timeout=120,
            )
            try:
                rep = json.loads(a.stdout)
                out["names"] = (rep.get("first_divergence") or {}).get("culprit_ranks")
                out["verdict"] = rep.get("verdict")
            except ValueError:
                out["analyze_error"] = a.stderr[-300:]
    if tool in ("detail", "desync"):
        ranks = re.findall(r"rank[s]? ?\[?(\d+(?:, ?\d+)*)", (r["first"] or {}).get("line", ""), re.I)
        out["names"] = sorted({int(x) for grp in ranks for x in re.split(r", ?", grp)}) if ranks else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--examples", type=Path, help="pytorch/examples distributed/ folder (with --gpu)")
    ap.add_argument("--tools", default=None, help="comma list (default: hctool,detail,fr,plain; +desync with --gpu)")
    ap.add_argument("--cases", default=None, help="comma list of substrings of case names")
    ap.add_argument("--timeout", type=float, default=40.0, help="seconds each job may run")
    ap.add_argument("--hang-after", type=float, default=3.0)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="hctool-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.gpu and not args.examples:
        ap.error("--gpu needs --examples DIR")
    cases = gpu_cases(args.examples, work / "src") if args.gpu else cpu_cases()
    tools = (args.tools or ("hctool,detail,desync,fr,plain" if args.gpu else "hctool,detail,fr,plain")).split(",")
    results = []
    for case in cases:
        if args.cases and not any(c in case["name"] for c in args.cases.split(",")):
            continue
        for tool in tools:
            if tool in ("desync", "detail", "fr") and case.get("clean") and args.gpu:
                continue  # device time is short: PyTorch's tools run on the divergent cases only
            if tool == "plain" and not case.get("clean"):
                continue  # a divergent program alone just hangs until --timeout
            r = run_tool(tool, case, args.timeout, args.hang_after, work)
            r.update(case=case["name"], tool=tool, expected=case.get("culprit"))
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k not in ("counts", "tail")}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
