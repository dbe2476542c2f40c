"""The incident variants: every historical behaviour the engine keeps on purpose, in one table.

Each is a flag whose default is the fix; the other choices are the shapes of real incidents,
named after what they do (docs/repros.md says which repro runs which). `Variants` is the
validated dataclass built from this table; `ServerArgs.variants` nests it, and the `hctool
launch` flags are generated from it, so a choice list is written here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple


class Variant(NamedTuple):
    name: str  # the field, and --name-with-dashes
    choices: tuple[str, ...]  # the fix first: it is the default
    upstream: str  # where the incident was reported / fixed
    help: str

    @property
    def default(self) -> str:
        return self.choices[0]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "prefetch_vote",
        ("per-tick", "bulk", "per-poll"),
        "sgl-project/sglang#30760, #33029",
        "how ranks agree a prefetch may end: one packed vote per tick, bulk before the admission loop "
        "(#33029), or per poll inside it (per-poll: #30760)",
    ),
    Variant(
        "prefetch_reap",
        ("agreed", "local"),
        "sgl-project/sglang#38268 family",
        "when a prefetch whose pages all arrived ends: at an agreed vote, or on the spot on this rank (local)",
    ),
    Variant(
        "prefetch_untracked_poll",
        ("join", "skip"),
        "sgl-project/sglang#38268",
        "per-poll/bulk poll of a rid without a live prefetch here: join the vote with a neutral "
        "contribution, or return early (skip)",
    ),
    Variant(
        "hicache_ack_check",
        ("packed", "per-queue", "skip-empty"),
        "sgl-project/sglang#26921, #26923",
        "agreeing on finished copies: one packed MIN per tick, a MIN per queue (per-queue: #26923), or per "
        "queue and skipped when the local queue is empty (skip-empty: #26921)",
    ),
    Variant(
        "lru_clock",
        ("logical", "wall"),
        "CP shared-KV eviction fork (INCIDENTS.md)",
        "eviction order: a replicated logical clock, or each rank's wall clock (wall)",
    ),
    Variant(
        "load_back_capacity",
        ("logical", "local"),
        "sgl-project/sglang#33442",
        "whether a host hit is loaded back: decided on the logical free count every rank shares, or on "
        "this rank's free-now count (local)",
    ),
    Variant(
        "waiting_timeout_decision",
        ("rank0", "local"),
        "sgl-project/sglang#27221, #27164",
        "who decides a waiting timeout: rank 0, sent to every rank with the next tick's requests, or each "
        "rank by its own clock (local)",
    ),
    Variant(
        "storage_hit_sync",
        ("count", "mask"),
        "sgl-project/sglang#39267",
        "how the prefetch thread agrees on a storage hit: MIN of the count, or MIN of a per-page mask "
        "sized by this rank's own hit (mask)",
    ),
    Variant(
        "decode_poll",
        ("fixed", "queue"),
        "sgl-project/sglang#36928, #21297",
        "decode transfer poll: a fixed-shape MIN every tick, or sized by the local queue and skipped "
        "when it is empty (queue)",
    ),
    Variant(
        "decode_restore_gate",
        ("slot", "event"),
        "sgl-project/sglang#29483",
        "decode local restore: gate on a free load-back slot (replicated), or on the local H2D event, "
        "entering loading_check() only where it fired (event)",
    ),
    Variant(
        "pp_hicache_sync",
        ("stage0", "min", "per-stage"),
        "sgl-project/sglang#22607, #27010, #29054, #29258",
        "PP: how stages agree on HiCache counts (ready acks, prefetch verdicts, L3 hits) and host "
        "capacity: stage 0 decides and later stages consume its counts (stage0, pp_sync #27010), MIN over "
        "every stage (min, #29258), or each stage on its own (per-stage)",
    ),
    Variant(
        "dp_idle_step",
        ("idle", "skip"),
        "vllm-project/vllm#28774, #28224, #43547",
        "DP: a replica with no tokens while another has work runs an idle step that joins "
        "coordinate_batch_across_dp and the MLP's gather (idle), or returns early (skip)",
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}


def _variant_field(v: Variant):
    return field(default=v.default, metadata={"help": f"{v.help} [{v.upstream}]", "choices": v.choices})


@dataclass(frozen=True)
class Variants:
    """The chosen behaviour of every incident variant (defaults: the fixes)."""

    prefetch_vote: str = _variant_field(BY_NAME["prefetch_vote"])
    prefetch_reap: str = _variant_field(BY_NAME["prefetch_reap"])
    prefetch_untracked_poll: str = _variant_field(BY_NAME["prefetch_untracked_poll"])
    hicache_ack_check: str = _variant_field(BY_NAME["hicache_ack_check"])
    lru_clock: str = _variant_field(BY_NAME["lru_clock"])
    load_back_capacity: str = _variant_field(BY_NAME["load_back_capacity"])
    waiting_timeout_decision: str = _variant_field(BY_NAME["waiting_timeout_decision"])
    storage_hit_sync: str = _variant_field(BY_NAME["storage_hit_sync"])
    decode_poll: str = _variant_field(BY_NAME["decode_poll"])
    decode_restore_gate: str = _variant_field(BY_NAME["decode_restore_gate"])
    pp_hicache_sync: str = _variant_field(BY_NAME["pp_hicache_sync"])
    dp_idle_step: str = _variant_field(BY_NAME["dp_idle_step"])

    def __post_init__(self) -> None:
        bad = [
            f"{BY_NAME[f.name].flag} must be one of {', '.join(BY_NAME[f.name].choices)}, got {getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) not in BY_NAME[f.name].choices
        ]
        if bad:
            raise ValueError("; ".join(bad))

    def non_default(self) -> dict[str, str]:
        """The variants that differ from the fix (what a report names)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != BY_NAME[f.name].default}


assert [f.name for f in fields(Variants)] == [v.name for v in VARIANTS], (
    "Variants and VARIANTS must list the same fields"
)
