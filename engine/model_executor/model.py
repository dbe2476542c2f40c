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
    def __init__(self, full: dict[str, torch.Tensor], tp_rank: int, tp_size: int, cfg: ModelConfig):
        h, hd = cfg.num_heads // tp_size, cfg.head_dim
        rows = slice(tp_rank * h * hd, (tp_rank + 1) * h * hd)
        inter = cfg.intermediate_size // tp_size
        cols = slice(tp_rank * inter, (tp_rank + 1) * inter)
        self.q = full["q"][rows].contiguous()
        self.k = full["k"][rows].contiguous()
        self.v = full["v"][rows].contiguous()
        self.o = full["o"][:, rows].contiguous()  # row-parallel
        self.up = full["up"][cols].contiguous()
        self.gate = full["gate"][cols].contiguous()
        self.down = full["down"][:, cols].contiguous()  # row-parallel
        self.ln1 = full["ln1"]
        self.ln2 = full["ln2"]


class TinyTransformer:
    def __init__(
        self, cfg: ModelConfig, tp_rank: int, tp_size: int, device: torch.device, group=None, pad_tokens: int = 0
    ):
        self.cfg, self.tp_size, self.device, self.group = cfg, tp_size, device, group
        self.pad_tokens = pad_tokens  # --pad-forward-tokens
        self.local_heads = cfg.num_heads // tp_size
        g = torch.Generator().manual_seed(cfg.seed)
        d, inter = cfg.hidden_size, cfg.intermediate_size

        def w(*shape, scale):
            return torch.randn(*shape, generator=g) * scale

        self.embed = w(cfg.vocab_size, d, scale=1.0).to(device)
        self.layers = []
        for _ in range(cfg.num_layers):
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
            lw = LayerWeights(full, tp_rank, tp_size, cfg)
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

    @staticmethod
    def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    # --- forward ------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, items: list[ForwardItem], kv_pool, wait_layer=None) -> torch.Tensor:
        """Run new tokens of every item through the model, writing their K/V into the
        pool; returns the logits of each item's last token, shape [len(items), vocab].

        wait_layer(i) blocks until layer i's load-back copies are done (HiCache)."""
        hd = self.cfg.head_dim
        ids = torch.tensor([t for it in items for t in it.input_ids], dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(it.start_pos, it.start_pos + len(it.input_ids)) for it in items]).to(self.device)
        lens = [len(it.input_ids) for it in items]
        new_slots = torch.cat([it.token_slots[it.start_pos :] for it in items]).to(self.device)
        h = self.embed[ids]
        for li, lw in enumerate(self.layers):
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
                outs.append(F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask).transpose(0, 1).reshape(n, -1))
                off += n
            attn = torch.cat(outs) @ lw.o.T
            h = h + self._all_reduce(attn)
            x = self._rms(h, lw.ln2)
            mlp = (F.silu(x @ lw.gate.T) * (x @ lw.up.T)) @ lw.down.T
            h = h + self._all_reduce(mlp)
        last = torch.tensor([sum(lens[: i + 1]) - 1 for i in range(len(lens))], device=self.device)
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
