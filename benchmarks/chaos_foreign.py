"""`hctool chaos explore` on programs nobody here wrote: pytorch/examples at 77f55b9,
`distributed/ddp-tutorial-series/multigpu_torchrun.py` and `distributed/minGPT-ddp`, copied at
run time into a work folder (never stored in this repository) with their device and backend
switched to CPU and gloo, nothing else. minGPT's own requirements (hydra-core, fsspec, boto3)
go into a folder of the work dir (pip --target), on the program's PYTHONPATH only; its config
is shrunk through hydra overrides on the command line (no code change) so a run takes seconds.
A correct program must come out with no anomaly (docs/performance.md, "Chaos on foreign code").

    python benchmarks/chaos_foreign.py --examples PATH --case ddp|mingpt [--budget 300] [--seed 0]

PATH: a pytorch/examples checkout, or its git directory (`fetch github:pytorch/examples`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

COMMIT = "77f55b9"
REPO = Path(__file__).resolve().parents[1]
SUBDIRS = {"ddp": "distributed/ddp-tutorial-series", "mingpt": "distributed/minGPT-ddp"}
MINGPT_DEPS = ["hydra-core", "omegaconf", "fsspec", "boto3"]
# (file, old, new): the device and backend switch. Each old text must be there: an upstream
# change fails loudly instead of running something else.
PATCHES = {
    "ddp": [
        ("multigpu_torchrun.py", '    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n', ""),
        ("multigpu_torchrun.py", 'init_process_group(backend="nccl")', 'init_process_group(backend="gloo")'),
        ("multigpu_torchrun.py", "self.model = model.to(self.gpu_id)", 'self.model = model.to("cpu")'),
        ("multigpu_torchrun.py", 'loc = f"cuda:{self.gpu_id}"', 'loc = "cpu"'),
        ("multigpu_torchrun.py", "DDP(self.model, device_ids=[self.gpu_id])", "DDP(self.model)"),
        ("multigpu_torchrun.py", "source = source.to(self.gpu_id)", 'source = source.to("cpu")'),
        ("multigpu_torchrun.py", "targets = targets.to(self.gpu_id)", 'targets = targets.to("cpu")'),
    ],
    "mingpt": [
        ("mingpt/main.py", "    if not verify_min_gpu_count(min_gpus=_min_gpu_count):", "    if False:"),
        (
            "mingpt/main.py",
            '    acc = torch.accelerator.current_accelerator()\n    rank = int(os.environ["LOCAL_RANK"])\n'
            '    device: torch.device = torch.device(f"{acc}:{rank}")\n'
            "    backend = torch.distributed.get_default_backend_for_device(device)\n"
            "    init_process_group(backend=backend)\n    torch.accelerator.set_device_index(rank)",
            '    init_process_group(backend="gloo")',
        ),
        (
            "mingpt/trainer.py",
            "        self.acc = torch.accelerator.current_accelerator()\n"
            '        self.device: torch.device = torch.device(f"{self.acc}:{self.local_rank}")',
            '        self.device: torch.device = torch.device("cpu")',
        ),
        ("mingpt/trainer.py", "self.model = model.to(self.local_rank)", "self.model = model.to(self.device)"),
        ("mingpt/trainer.py", "DDP(self.model, device_ids=[self.local_rank])", "DDP(self.model)"),
        ("mingpt/trainer.py", "source = source.to(self.local_rank)", "source = source.to(self.device)"),
        ("mingpt/trainer.py", "targets = targets.to(self.local_rank)", "targets = targets.to(self.device)"),
    ],
}


def extract(examples: Path, case: str, work: Path) -> Path:
    """The example's folder at COMMIT, copied into work (git archive, or a plain copy)."""
    sub = SUBDIRS[case]
    git_dir = examples if (examples / "objects").is_dir() else examples / ".git"
    out = work / case
    if out.exists():
        return out / sub
    out.mkdir(parents=True)
    if git_dir.is_dir():
        with tempfile.TemporaryFile() as tar:
            # the subtree alone: a mirror may lack the blobs of large files elsewhere in the repository
            subprocess.run(
                ["git", "--git-dir", str(git_dir), "archive", f"--prefix={sub}/", f"{COMMIT}:{sub}"],
                stdout=tar,
                check=True,
            )
            tar.seek(0)
            with tarfile.open(fileobj=tar) as t:
                t.extractall(out, filter="data")
        return out / sub
    import shutil

    shutil.copytree(examples / sub, out / sub)
    return out / sub


def patch(folder: Path, case: str) -> None:
    for name, old, new in PATCHES[case]:
        path = folder / name
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"{name} at {COMMIT} has no {old.strip()[:60]!r}: the example changed")
        path.write_text(text.replace(old, new, 1))


def command(folder: Path, case: str) -> list[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    if case == "ddp":
        return [*torchrun, str(folder / "multigpu_torchrun.py"), "3", "1"]
    data = folder / "mingpt" / "data" / "input.txt"
    overrides = [
        "gpt_config.n_layer=2",
        "gpt_config.n_head=2",
        "gpt_config.n_embd=64",
        f"data_config.path={data}",
        "data_config.truncate=0.002",
        "data_config.block_size=32",
        "trainer_config.batch_size=16",
        "trainer_config.max_epochs=1",
        "trainer_config.data_loader_workers=0",
        "trainer_config.use_amp=False",
        "trainer_config.save_every=1",
    ]
    return [*torchrun, str(folder / "mingpt" / "main.py"), *overrides]


def deps(work: Path) -> Path:
    target = work / "deps"
    if not target.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *MINGPT_DEPS], check=True
        )
    return target


def run_reaped(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run whose timeout (or Ctrl-C) ends the whole tree: torchrun's workers too."""
    from hctool.supervise.procs import kill_tree

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # TimeoutExpired, KeyboardInterrupt
        kill_tree(proc.pid)
        proc.communicate()
        raise SystemExit(f"{' '.join(cmd[:4])} ...: stopped after {timeout:.0f} s or by a signal") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=Path, required=True, help="pytorch/examples checkout or git dir")
    ap.add_argument("--case", choices=sorted(SUBDIRS), required=True)
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a new temporary one)")
    ap.add_argument("--plain", action="store_true", help="one plain torchrun run only (no hctool)")
    args = ap.parse_args()
    work = (args.work or Path(tempfile.mkdtemp(prefix="hctool-foreign-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    folder = extract(args.examples.resolve(), args.case, work)
    if not (folder / ".patched").exists():
        patch(folder, args.case)
        (folder / ".patched").write_text(COMMIT)
    env = dict(os.environ)
    if args.case == "mingpt":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(deps(work)), env.get("PYTHONPATH")) if p)
    cmd = command(folder, args.case)
    if args.plain:
        t0 = time.monotonic()
        run = run_reaped(cmd, 600, env=env, cwd=tempfile.mkdtemp(dir=work))
        print(
            json.dumps(
                {
                    "case": args.case,
                    "exit": run.returncode,
                    "seconds": round(time.monotonic() - t0, 1),
                    "tail": run.stdout[-500:] + run.stderr[-1500:],
                },
                indent=1,
            )
        )
        return
    out_dir = work / f"chaos-{args.case}-{args.seed}"
    t0 = time.monotonic()
    run = run_reaped(
        [
            sys.executable,
            "-m",
            "hctool",
            "chaos",
            "explore",
            "--budget",
            str(args.budget),
            "--seed",
            str(args.seed),
            "--json",
            "--artifacts",
            str(out_dir),
            "--",
            *cmd,
        ],
        args.budget * 4 + 600,
        env=env,
    )
    try:
        report = json.loads(run.stdout)
    except ValueError:
        sys.exit(f"chaos explore exit {run.returncode}: {run.stderr[-2000:]}")
    verdicts = [r["verdict"] for r in report["runs"]]
    print(
        json.dumps(
            {
                "case": args.case,
                "commit": COMMIT,
                "exit": run.returncode,
                "verdict": report["verdict"],
                "schedules": report["schedules"],
                "schedules_per_min": report.get("schedules_per_min"),
                "valid": verdicts.count("valid"),
                "unknown": verdicts.count("unknown"),
                "invalid": verdicts.count("invalid"),
                "anomalies": report["anomalies"],
                "wall_s": round(time.monotonic() - t0, 1),
                "artifacts": str(out_dir),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
