"""SGLang: srt/models/llama.py (a tiny Llama-shaped decoder; weights from a seed).

A tiny decoder-only transformer split over tensor-parallel ranks.

Every rank builds the full weights from the seed and keeps its shard: heads and
the MLP's intermediate columns are split; o_proj and down_proj are row-parallel
and end in an all_reduce, so TP=1 and TP=2 compute the same function. Attention
reads K/V from the paged L1 pool, which is what makes cached KV matter: a wrong
byte in any tier changes the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from engine.managers.io_struct import SAMPLING_EPS
from engine.server_args import ModelConfig


@dataclass
class ForwardItem:
    """One request's slice of a batch: the new tokens and where all its KV lives."""

    input_ids: list[int]  # new tokens (extend) or the last token (decode)
    start_pos: int  # position of input_ids[0]
    token_slots: torch.Tensor  # L1 slots of positions [0, start_pos + len(input_ids))


class LayerWeights:
    def __init__(self, full: dict[str, torch.Tensor], tp_rank: int, tp_size: int, cfg: ModelConfig, mlp_shard=None):
        h, hd = cfg.num_heads // tp_size, cfg.head_dim
        rows = slice(tp_rank * h * hd, (tp_rank + 1) * h * hd)
        mlp_rank, mlp_size = mlp_shard or (tp_rank, tp_size)  # DP: the replicas share the MLP
        inter = cfg.intermediate_size // mlp_size
        cols = slice(mlp_rank * inter, (mlp_rank + 1) * inter)
        self.q = full["q"][rows].contiguous()
        self.k = full["k"][rows].contiguous()
        self.v = full["v"][rows].contiguous()
        self.o = full["o"][:, rows].contiguous()  # row-parallel
        self.up = full["up"][cols].contiguous()
        self.gate = full["gate"][cols].contiguous()
        self.down = full["down"][:, cols].contiguous()  # row-parallel
        self.ln1 = full["ln1"]
        self.ln2 = full["ln2"]


def layer_range(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """The layers of stage pp_rank (SGLang's get_pp_indices: contiguous, the first stages
    take one more when they do not divide evenly)."""
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (pp_rank < extra))


class TinyTransformer:
    def __init__(
        self,
        cfg: ModelConfig,
        tp_rank: int,
        tp_size: int,
        device: torch.device,
        group=None,
        pad_tokens: int = 0,
        pp_rank: int = 0,
        pp_size: int = 1,
        dp=None,
    ):
        """pp_rank/pp_size: this stage keeps only its layers (the embedding on the first stage,
        the final norm and lm_head on the last), so it computes its part of the same function.
        dp: (dp_rank, dp_size, dp_group, mlp_group) of SGLang's DP attention: attention is
        this replica's (its heads over its TP), the MLP's columns are split over every rank
        of every replica and run on the tokens of all replicas, gathered per layer."""
        self.cfg, self.tp_size, self.device, self.group = cfg, tp_size, device, group
        self.pad_tokens = pad_tokens  # --pad-forward-tokens
        self.local_heads = cfg.num_heads // tp_size
        self.layer_ids = layer_range(cfg.num_layers, pp_rank, pp_size)
        self.is_first, self.is_last = pp_rank == 0, pp_rank == pp_size - 1
        self.dp_rank, self.dp_size, self.dp_group, self.mlp_group = dp or (0, 1, None, None)
        mlp_shard = (self.dp_rank * tp_size + tp_rank, self.dp_size * tp_size) if self.dp_size > 1 else None
        g = torch.Generator().manual_seed(cfg.seed)
        d, inter = cfg.hidden_size, cfg.intermediate_size

        def w(*shape, scale):
            return torch.randn(*shape, generator=g) * scale

        self.embed = w(cfg.vocab_size, d, scale=1.0).to(device)
        self.layers = []
        for li in range(cfg.num_layers):  # every stage draws every layer: the seed's order
            full = {
                "q": w(d, d, scale=d**-0.5),
                "k": w(d, d, scale=d**-0.5),
                "v": w(d, d, scale=d**-0.5),
                "o": w(d, d, scale=d**-0.5),
                "up": w(inter, d, scale=d**-0.5),
                "gate": w(inter, d, scale=d**-0.5),
                "down": w(d, inter, scale=inter**-0.5),
                "ln1": 1.0 + 0.1 * w(d, scale=1.0),
                "ln2": 1.0 + 0.1 * w(d, scale=1.0),
            }
            if li not in self.layer_ids:
                continue
            lw = LayerWeights(full, tp_rank, tp_size, cfg, mlp_shard)
            for name, t in vars(lw).items():
                setattr(lw, name, t.to(device))
            self.layers.append(lw)
        self.final_norm = (1.0 + 0.1 * w(d, scale=1.0)).to(device)
        self.lm_head = w(cfg.vocab_size, d, scale=d**-0.5).to(device)
        hd = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.inv_freq = inv_freq.to(device)

    # --- pieces -----------------------------------------------------------------
    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        freqs = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The row-parallel output's sum over ranks. With pad_tokens, a forward of at most
        that many tokens reduces pad_tokens rows (zeros after its own), as replaying a
        CUDA graph captured at that size does upstream: ranks whose batches differ in
        size then exchange equal shapes, and their rows are summed silently."""
        if self.tp_size == 1:
            return x
        n = x.shape[0]
        if n < self.pad_tokens:
            x = torch.cat([x, x.new_zeros(self.pad_tokens - n, x.shape[1])])
        dist.all_reduce(x, group=self.group)
        return x[:n]

    def _dp_gather(self, x: torch.Tensor, dp_num_tokens: list[int]) -> torch.Tensor:
        """DP attention: every replica's tokens, each padded to the most any replica has this
        step (the count coordinate_batch_across_dp agreed), gathered from this tp_rank's rank
        in every replica. An idle replica joins with padding only."""
        most = max(dp_num_tokens)
        padded = torch.cat([x, x.new_zeros(most - x.shape[0], x.shape[1])]) if x.shape[0] < most else x
        parts = [torch.empty_like(padded) for _ in range(self.dp_size)]
        dist.all_gather(parts, padded.contiguous(), group=self.dp_group)
        return torch.cat([p[:n] for p, n in zip(parts, dp_num_tokens)])

    def _mlp(self, x: torch.Tensor, lw: LayerWeights, dp_num_tokens: list[int] | None) -> torch.Tensor:
        if self.dp_size == 1:
            return self._all_reduce((F.silu(x @ lw.gate.T) * (x @ lw.up.T)) @ lw.down.T)
        xs = self._dp_gather(x, dp_num_tokens)
        out = (F.silu(xs @ lw.gate.T) * (xs @ lw.up.T)) @ lw.down.T
        dist.all_reduce(out, group=self.mlp_group)  # every rank of every replica holds a column shard
        start = sum(dp_num_tokens[: self.dp_rank])
        return out[start : start + x.shape[0]]

    @staticmethod
    def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    # --- forward ------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        items: list[ForwardItem],
        kv_pool,
        wait_layer=None,
        hidden: torch.Tensor | None = None,
        dp_num_tokens: list[int] | None = None,
    ) -> torch.Tensor:
        """Run new tokens of every item through this stage's layers, writing their K/V into
        the pool (indexed by the stage's own layer number). The last stage returns the
        logits of each item's last token, shape [len(items), vocab]; another stage returns
        the hidden states for the next one, shape [tokens, hidden]. A later stage takes the
        previous stage's hidden states instead of embedding the ids.

        wait_layer(i) blocks until layer i's load-back copies are done (HiCache).
        dp_num_tokens: every replica's token count this step (DP); items may then be empty
        (the idle step), which runs only the MLP's gather and reduce."""
        hd = self.cfg.head_dim
        lens = [len(it.input_ids) for it in items]
        if not items:
            h = self.embed.new_zeros(0, self.cfg.hidden_size)
        elif hidden is not None:
            h = hidden.to(self.device)
        else:
            ids = torch.tensor([t for it in items for t in it.input_ids], dtype=torch.long, device=self.device)
            h = self.embed[ids]
        if items:
            pos = torch.cat([torch.arange(it.start_pos, it.start_pos + n) for it, n in zip(items, lens)])
            pos = pos.to(self.device)
            new_slots = torch.cat([it.token_slots[it.start_pos :] for it in items]).to(self.device)
        for li, lw in enumerate(self.layers):
            if items:
                x = self._rms(h, lw.ln1)
                q = self._rope((x @ lw.q.T).view(-1, self.local_heads, hd), pos)
                k = self._rope((x @ lw.k.T).view(-1, self.local_heads, hd), pos)
                v = (x @ lw.v.T).view(-1, self.local_heads, hd)
                if wait_layer is not None:
                    wait_layer(li)
                kv_pool.k_buffer[li][new_slots] = k
                kv_pool.v_buffer[li][new_slots] = v
                outs, off = [], 0
                for it, n in zip(items, lens):
                    slots = it.token_slots[: it.start_pos + n].to(self.device)
                    kk = kv_pool.k_buffer[li][slots].transpose(0, 1)  # [heads, ctx, hd]
                    vv = kv_pool.v_buffer[li][slots].transpose(0, 1)
                    qq = q[off : off + n].transpose(0, 1)  # [heads, n, hd]
                    ctx = it.start_pos + n
                    qpos = torch.arange(it.start_pos, ctx, device=self.device)[:, None]
                    mask = torch.arange(ctx, device=self.device)[None, :] <= qpos
                    attn = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
                    outs.append(attn.transpose(0, 1).reshape(n, -1))
                    off += n
                attn = torch.cat(outs) @ lw.o.T
                h = h + self._all_reduce(attn)
            x = self._rms(h, lw.ln2)
            h = h + self._mlp(x, lw, dp_num_tokens)
        if not self.is_last:
            return h
        last = torch.tensor([sum(lens[: i + 1]) - 1 for i in range(len(lens))], dtype=torch.long, device=self.device)
        return self._rms(h[last], self.final_norm) @ self.lm_head.T

    @staticmethod
    def sample(logits: torch.Tensor, temperatures: list[float], generators: list[torch.Generator | None]) -> list[int]:
        """Greedy below SAMPLING_EPS (as SGLang); otherwise seeded sampling (the same
        on every rank). Never raises for a temperature: logits are shifted so their
        maximum is 0 before the division, so no inf/inf or 0/0 can reach multinomial,
        and a non-finite logit (it cannot occur with intact KV) counts as impossible."""
        out = []
        for row, t, g in zip(logits, temperatures, generators):
            row = torch.nan_to_num(row.float().cpu(), nan=-torch.inf, posinf=torch.finfo(torch.float32).max)
            if not t >= SAMPLING_EPS or g is None or not math.isfinite(t) or not torch.isfinite(row.max()):
                out.append(int(torch.argmax(row).item()))
            else:
                probs = torch.softmax((row - row.max()) / t, dim=-1)
                out.append(int(torch.multinomial(probs, 1, generator=g).item()))
        return out
