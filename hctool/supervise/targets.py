"""What a runner runs, from the words after `--` (docs/contracts.md, "Targets"): words that
start with `-` are engine flags (hctool's engine, `hctool launch` flags); anything else is a
command: `torchrun --nproc-per-node 2 train.py ...`, `python -m pkg ...`, `SCRIPT.py ...`
(started --nproc times by hctool itself, with torchrun's variables)."""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

# torchrun's options that take a value (the script is the first word after them)
_TORCHRUN_VALUED = {
    "--nnodes",
    "--nproc-per-node",
    "--nproc_per_node",
    "--rdzv-backend",
    "--rdzv_backend",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-id",
    "--rdzv_id",
    "--rdzv-conf",
    "--rdzv_conf",
    "--max-restarts",
    "--max_restarts",
    "--monitor-interval",
    "--monitor_interval",
    "--start-method",
    "--start_method",
    "--role",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--local-addr",
    "--local_addr",
    "--log-dir",
    "--log_dir",
    "-r",
    "--redirects",
    "-t",
    "--tee",
    "--local-ranks-filter",
    "--local_ranks_filter",
    "--logs-specs",
    "--logs_specs",
    "--rdzv-timeout",
    "--rdzv_timeout",
}


class TargetError(ValueError):
    """A target that cannot be run (one line)."""


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]

    @property
    def script_mode(self) -> bool:
        """A bare SCRIPT.py: hctool starts its ranks itself."""
        return self.words[0].endswith(".py")

    @property
    def label(self) -> str:
        return "command: " + shlex.join(self.words)

    def main_source(self) -> Path | None:
        """The file whose module is __main__ in each rank (None: not a Python program we can see)."""
        words = list(self.words)
        if self.script_mode:
            return Path(words[0])
        exe, i = os.path.basename(words[0]), 1
        if exe.startswith("python"):
            while i < len(words) and words[i].startswith("-") and words[i] != "-m":
                i += 1
            if words[i : i + 2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
                exe, i = "torchrun", i + 2
        elif exe != "torchrun":
            return None
        if exe == "torchrun":  # its options, then the script (or -m module) and the script's own arguments
            while i < len(words) and words[i].startswith("-") and words[i] not in ("-m", "--module"):
                i += 2 if words[i] in _TORCHRUN_VALUED else 1
        if i < len(words) and words[i] in ("-m", "--module"):
            return _module_source(words[i + 1]) if i + 1 < len(words) else None
        return Path(words[i]) if i < len(words) and words[i].endswith(".py") else None

    def anchored(self) -> Command:
        """The same command with its relative file arguments made absolute, so that it runs the
        same from another working directory (chaos gives each run its own)."""
        out = [
            self.words[0]
            if not Path(self.words[0]).is_file() or "/" not in self.words[0]
            else str(Path(self.words[0]).resolve())
        ]
        for w in self.words[1:]:
            out.append(str(Path(w).resolve()) if not w.startswith("-") and "=" not in w and Path(w).is_file() else w)
        if self.script_mode:
            out[0] = str(Path(self.words[0]).resolve())
        return Command(tuple(out))

    def world_size(self, nproc: int) -> int | None:
        """Ranks the command starts, where it says so (torchrun's --nproc-per-node on one node)."""
        if self.script_mode:
            return nproc
        words = list(self.words)
        for k, w in enumerate(words):
            name, _, value = w.partition("=")
            if name in ("--nproc-per-node", "--nproc_per_node"):
                value = value or (words[k + 1] if k + 1 < len(words) else "")
                return int(value) if value.isdigit() else None
        return None


@dataclass(frozen=True)
class EngineFlags:
    flags: tuple[str, ...]

    @property
    def label(self) -> str:
        return "engine: " + shlex.join(self.flags)


def parse_target(words: list[str]) -> Command | EngineFlags:
    if not words:
        raise TargetError("nothing after --")
    if words[0].startswith("-"):
        return EngineFlags(tuple(words))
    cmd = Command(tuple(words))
    if cmd.script_mode:
        if not Path(words[0]).is_file():
            raise TargetError(f"script not found: {words[0]}")
    elif shutil.which(words[0]) is None:
        if Path(words[0]).is_file():  # a data file, or a script without its execute bit
            raise TargetError(f"{words[0]} is neither a Python script (.py) nor an executable")
        raise TargetError(f"command not found: {words[0]}")
    return cmd


def _module_source(module: str) -> Path | None:
    """The file of `pkg.mod` found on sys.path without importing anything."""
    import sys

    parts = module.split(".")
    for base in [os.getcwd(), *[p for p in sys.path if p]]:
        here = Path(base).joinpath(*parts)
        for candidate in (here.with_suffix(".py"), here / "__main__.py", here / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None
