"""SGLang: srt/server_args.py.

ServerArgs: every engine flag in one validated dataclass (names follow SGLang).

The same class builds the `hctool launch` flag parser and travels to the ranks
as JSON, so the frontend and every rank see one configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field, fields

from engine.lab.variants import VARIANTS, Variants

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
STORAGE_BACKENDS = ("file",)
DISAGG_MODES = ("null", "prefill", "decode")
DEVICES = ("cpu", "cuda")


def _opt(default, help: str, choices=None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class ModelConfig:
    """The tiny decoder-only transformer; weights come from `seed`, never a download."""

    vocab_size: int = 32768
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    rope_theta: float = 10000.0
    eos_token_id: int = 0
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# Bounds of every numeric flag, in one table: pools are allocated at start, so a typo must
# not ask for the machine's memory, and a NaN, an infinity or a negative timeout must not pass
# as a setting (NaN fails every comparison, so the check below rejects it).
NUMBER_LIMITS = {
    "tp_size": (1, 1 << 12),
    "pp_size": (1, 64),
    "dp_size": (1, 1 << 10),
    "model_seed": (0, 2**63 - 1),
    "page_size": (1, 4096),
    "max_total_tokens": (1, 1 << 26),
    "max_running_requests": (1, 1 << 16),
    "max_prefill_tokens": (1, 1 << 26),
    "max_queued_requests": (0, 1 << 20),
    "hicache_ratio": (0, 1000),
    "hicache_size": (0, 10_000),
    "prefetch_timeout_base": (0, 86_400),
    "prefetch_timeout_per_ki_token": (0, 86_400),
    "prefetch_timeout_max": (0, 86_400),
    "prefetch_threshold": (0, 1 << 26),
    "req_waiting_timeout": (0, 7 * 86_400),
    "pad_forward_tokens": (0, 1 << 20),
    "dist_timeout": (0.001, 7 * 86_400),
    "disaggregation_bootstrap_port": (0, 65535),
    "disaggregation_transfer_timeout": (0.001, 7 * 86_400),
}


@dataclass(frozen=True)
class ServerArgs:
    tp_size: int = _opt(1, "tensor-parallel ranks")
    pp_size: int = _opt(1, "pipeline stages: the layers split over stages, activations sent stage to stage")
    dp_size: int = _opt(
        1, "data-parallel replicas behind one router; their steps are coordinated (SGLang's DP attention)"
    )
    device: str = _opt("cpu", "cpu or cuda (the model's group: see --model-backend)", DEVICES)
    model_backend: str = _opt(
        "auto",
        "backend of the model's group: auto (NCCL on cuda with a GPU per rank, gloo "
        "when ranks share a GPU or on cpu), nccl or gloo",
        ("auto", "nccl", "gloo"),
    )
    model_seed: int = _opt(0, "seed of the model weights")
    page_size: int = _opt(16, "tokens per KV page (L1, L2 and L3 move whole pages)")
    max_total_tokens: int = _opt(8192, "L1 (device) KV pool size in tokens, per rank")
    max_running_requests: int = _opt(32, "most requests in a batch")
    max_queued_requests: int = _opt(0, "most requests waiting; one more is answered 503 (0: no bound)")
    max_prefill_tokens: int = _opt(16384, "most new tokens in one prefill batch")
    disable_radix_cache: bool = _opt(False, "no prefix reuse at all (the no-cache reference)")
    enable_hierarchical_cache: bool = _opt(False, "add the L2 host tier (and L3 with a storage backend)")
    hicache_ratio: float = _opt(2.0, "host pool size as a multiple of the device pool")
    hicache_size: float = _opt(0.0, "host pool size in GB; overrides --hicache-ratio when > 0")
    hicache_write_policy: str = _opt("write_through", "when device KV is copied to host", WRITE_POLICIES)
    hicache_storage_backend: str | None = _opt(None, "L3 backend (file)", STORAGE_BACKENDS)
    hicache_storage_dir: str | None = _opt(None, "directory of the file backend (default: RUN_DIR/storage)")
    hicache_storage_prefetch_policy: str = _opt("timeout", "when a storage prefetch may end", PREFETCH_POLICIES)
    prefetch_timeout_base: float = _opt(1.0, "timeout policy: seconds allowed per prefetch")
    prefetch_timeout_per_ki_token: float = _opt(0.25, "timeout policy: extra seconds per 1024 tokens")
    prefetch_timeout_max: float = _opt(10.0, "timeout policy: upper bound in seconds")
    prefetch_threshold: int = _opt(64, "least number of storage tokens worth a prefetch")
    req_waiting_timeout: float = _opt(
        0.0, "abort a request that waited longer than this many seconds (0: never; SGLANG_REQ_WAITING_TIMEOUT)"
    )
    pad_forward_tokens: int = _opt(
        0,
        "run the TP all_reduces of every forward of at most this many tokens on this many rows, as "
        "replaying a CUDA graph captured at that size does (0: off)",
    )
    state_digest: bool = _opt(
        False,
        "fold a digest of the replicated state into the per-tick MIN sync: every rank stops at the "
        "first tick it differs",
    )
    dist_timeout: float = _opt(600.0, "torch.distributed group timeout in seconds")
    run_dir: str = _opt("", "directory for logs, traces and default storage")
    disaggregation_mode: str = _opt("null", "PD role of this server: null (plain TP), prefill or decode", DISAGG_MODES)
    disaggregation_bootstrap_host: str = _opt("127.0.0.1", "prefill: address its bootstrap server listens on")
    disaggregation_bootstrap_port: int = _opt(8998, "prefill: port of its bootstrap server (on prefill rank 0)")
    disaggregation_kv_host: str = _opt("127.0.0.1", "decode: address its ranks receive KV on (one free port each)")
    disaggregation_transfer_timeout: float = _opt(60.0, "decode: seconds a request may wait for its KV")
    disaggregation_decode_enable_radix_cache: bool = _opt(
        False, "decode: keep a radix cache (and HiCache with --enable-hierarchical-cache)"
    )
    # The incident variants (engine/lab/variants.py): one flag each, the fix by default.
    variants: Variants = field(default_factory=Variants, metadata={"cli": False})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"cli": False})

    def __post_init__(self) -> None:
        if isinstance(self.variants, dict):
            object.__setattr__(self, "variants", Variants(**self.variants))
        model = ModelConfig(**self.model) if isinstance(self.model, dict) else self.model
        object.__setattr__(self, "model", dataclasses.replace(model, seed=self.model_seed))
        problems: list[str] = []
        for name, (low, high) in NUMBER_LIMITS.items():
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and low <= value <= high)
            ):
                problems.append(f"{_flag(name)} must be between {low} and {high}, got {value!r}")
        if not problems and self.model.num_heads % self.tp_size:
            problems.append(f"--tp {self.tp_size} must divide the model's {self.model.num_heads} heads")
        if not problems and self.pp_size > self.model.num_layers:
            problems.append(f"--pp-size {self.pp_size} is more than the model's {self.model.num_layers} layers")
        if not problems and self.model.intermediate_size % (self.tp_size * self.dp_size):
            problems.append(
                f"--tp {self.tp_size} x --dp-size {self.dp_size} must divide the model's "
                f"{self.model.intermediate_size} MLP columns (DP replicas share the MLP)"
            )
        if self.pp_size > 1 and self.dp_size > 1:
            problems.append("--pp-size and --dp-size cannot be combined yet (each combines with --tp)")
        if self.disaggregation_mode != "null" and (self.pp_size > 1 or self.dp_size > 1):
            problems.append("PD disaggregation runs TP servers only (no --pp-size or --dp-size)")
        if not problems and self.max_total_tokens < 4 * self.page_size:
            problems.append(f"--max-total-tokens must hold at least 4 pages ({4 * self.page_size} tokens)")
        if self.hicache_ratio <= 1.0 and self.enable_hierarchical_cache and self.hicache_size <= 0:
            problems.append("--hicache-ratio must be above 1 (the host pool must be larger than the device pool)")
        for f in fields(self):  # the choice lists live in the field metadata alone
            allowed = f.metadata.get("choices")
            if allowed and getattr(self, f.name) not in (*allowed, *((None,) if f.default is None else ())):
                problems.append(f"{_flag(f.name)} must be one of {', '.join(allowed)}")
        if self.hicache_storage_backend and not self.enable_hierarchical_cache:
            problems.append("--hicache-storage-backend needs --enable-hierarchical-cache")
        if self.enable_hierarchical_cache and self.disable_radix_cache:
            problems.append("--enable-hierarchical-cache cannot be combined with --disable-radix-cache")
        if self.model_backend == "nccl" and self.device != "cuda":
            problems.append("--model-backend nccl needs --device cuda")
        if self.state_digest and not self.enable_hierarchical_cache:
            problems.append("--state-digest needs --enable-hierarchical-cache (it rides HiCache's per-tick sync)")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def world_size(self) -> int:
        """Rank processes of one server: dp replicas x pp stages x tp ranks."""
        return self.tp_size * self.pp_size * self.dp_size

    @property
    def max_context_len(self) -> int:
        """Longest prompt + output one request may have: it must fit the L1 pool."""
        return self.max_total_tokens - self.page_size

    @property
    def decode_radix_disabled(self) -> bool:
        """A decode server keeps no radix cache unless asked (as in SGLang)."""
        return self.disaggregation_mode == "decode" and not self.disaggregation_decode_enable_radix_cache

    # --- transport ------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServerArgs:
        return cls(**json.loads(text))

    # --- command line ---------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in [*fields(cls), *fields(Variants)]:
            if f.metadata.get("cli") is False or f.name == "tp_size":
                continue
            kwargs: dict = {"dest": f.name, "default": f.default, "help": f.metadata.get("help")}
            if f.type in ("bool", bool):
                kwargs["action"] = "store_true"
            else:
                kwargs["type"] = {"int": int, "float": float}.get(str(f.type), str)
                if f.metadata.get("choices"):
                    kwargs["choices"] = f.metadata["choices"]
            parser.add_argument(_flag(f.name), **kwargs)

    @classmethod
    def from_cli(cls, argv: list[str], **overrides) -> ServerArgs:
        """Parse engine flags; raises ValueError with a one-line reason on bad input."""
        parser = _RaisingParser(prog="hctool launch", add_help=False)
        cls.add_cli_args(parser)
        flat = {**vars(parser.parse_args(argv)), **overrides}
        chosen = {v.name: flat.pop(v.name) for v in VARIANTS if v.name in flat}
        if not isinstance(flat.get("variants"), Variants):
            flat["variants"] = Variants(**chosen)
        return cls(**flat)

    def cli_flags(self) -> list[str]:
        """The flags that rebuild these settings (defaults left out), for replay commands."""
        out: list[str] = []
        for f in [*fields(self), *fields(Variants)]:
            if f.metadata.get("cli") is False or f.name == "tp_size":
                continue
            value = getattr(self.variants if f.name in Variants.__dataclass_fields__ else self, f.name)
            if value == f.default:
                continue
            out += [_flag(f.name)] if value is True else [_flag(f.name), str(value)]
        return out

    @classmethod
    def cli_help(cls) -> str:
        parser = argparse.ArgumentParser(prog="engine flags", add_help=False)
        cls.add_cli_args(parser)
        return parser.format_help()


def _flag(name: str) -> str:
    return "--tp" if name == "tp_size" else "--" + name.replace("_", "-")


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit
        raise ValueError(message)
