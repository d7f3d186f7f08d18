"""A causal LM's forward over a paged KV cache, on Hugging Face's own modules and weights.

The model is loaded with ``transformers`` (``AutoModelForCausalLM.from_pretrained`` on a
local folder, safetensors, ``local_files_only``) and its layers are called as they are:
embeddings, layer norms, projections, MLPs, rotary embedding and LM head are Hugging
Face's modules, so the numbers are theirs. Only attention is wattserve's, because that is
where the cache lives: every sequence's keys and values sit in fixed-size blocks of one
pool preallocated per layer (vLLM's PagedAttention layout, ``[blocks * block_size, kv
heads, head dim]``); a sequence's block table maps its position ``p`` to slot
``table[p // block_size] * block_size + p % block_size``. A sequence grows by taking one
more block, never by copying; its blocks go back to the pool when it finishes.

One ``forward`` runs a step over sequences at different positions: each contributes a run of
new tokens (a whole prompt, a prefill chunk, or one decode token), all runs flattened into
one ``[tokens, hidden]`` batch for the projections and MLPs (the batched work), their new
keys/values written into their slots, then one masked scaled-dot-product attention over
every sequence's gathered context (query ``i`` at position ``p`` sees keys ``0..p``).

Two shapes are served: GPT-2 (``GPT2LMHeadModel``: learned positions, fused ``c_attn``)
and Llama (``LlamaForCausalLM`` and the models sharing its layout: rotary positions,
grouped-query attention). CUDA: the pool and the model sit on the engine's device; only
the CPU path is tested here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama"}


@dataclass(frozen=True, slots=True)
class Run:
    """One sequence's part of a step: new tokens from ``start``, and where its cache lives."""

    tokens: Sequence[int]
    start: int  # position of tokens[0]; keys/values of 0..start-1 are already cached
    blocks: Sequence[int]  # block table (covers start + len(tokens) positions)


def load_causal_lm(path: Path, device: torch.device, dtype: torch.dtype) -> Any:
    """The folder's model through ``transformers``, offline; refuses shapes it cannot page."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in SUPPORTED:
        raise ValueError(
            f"model_type {config.model_type!r} is not served (served: {', '.join(sorted(SUPPORTED))})"
        )
    model = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=dtype, use_safetensors=True, attn_implementation="eager"
    )
    return model.eval().to(device)


class PagedCausalLM:
    """The model's forward over a block pool. Blocking; called from the engine's thread."""

    def __init__(self, model: Any, num_blocks: int, block_size: int) -> None:
        cfg = model.config
        self.model = model
        self.kind = SUPPORTED[cfg.model_type]
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        hidden = int(cfg.hidden_size)
        self.head_dim = int(getattr(cfg, "head_dim", None) or hidden // self.heads)
        self.vocab_size = int(cfg.vocab_size)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0) or None
        if self.kind == "gpt2":
            self.layers = list(model.transformer.h)
        else:
            self.layers = list(model.model.layers)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        shape = (num_blocks * block_size, self.kv_heads, self.head_dim)
        # One preallocated pool per layer: memory is fixed from the start, whatever the load.
        self.k_pool = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.v_pool = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]

    @property
    def pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_pool, *self.v_pool))

    # ------------------------------------------------------------------ indices
    def _layout(self, runs: Sequence[Run]) -> dict[str, Any]:
        """Token ids, positions and write slots of a step, and its attention groups: the
        decodes (one query each) padded together, each prefill chunk alone, so that one long
        chunk does not pad every decode's queries to its length. Tensor ops over a padded
        block table (no Python loop over positions)."""
        b = self.block_size
        lens = torch.tensor([len(r.tokens) for r in runs])
        starts = torch.tensor([r.start for r in runs])
        width = max(len(r.blocks) for r in runs)
        table = torch.zeros((len(runs), width), dtype=torch.long)
        for s, run in enumerate(runs):
            table[s, : len(run.blocks)] = torch.tensor(run.blocks, dtype=torch.long)
        firsts = torch.cumsum(lens, 0) - lens  # where each run starts in the flat token batch
        q_off = torch.arange(int(lens.max()))
        q_pos = starts[:, None] + q_off[None, :]  # [seqs, max_q] position of each query
        q_valid = q_off[None, :] < lens[:, None]
        pos = q_pos[q_valid]  # the runs' positions, flattened in run order
        flat_run = torch.arange(len(runs))[:, None].expand_as(q_pos)[q_valid]
        write = table[flat_run, pos // b] * b + pos % b
        decodes = torch.nonzero(lens == 1).reshape(-1)
        groups = [self._group(decodes, starts, lens, table, firsts)] if len(decodes) else []
        groups += [self._group(i.reshape(1), starts, lens, table, firsts) for i in torch.nonzero(lens > 1)]
        dev = self.device
        return {
            "ids": torch.tensor([t for r in runs for t in r.tokens], dtype=torch.long, device=dev),
            "pos": pos.to(dev),
            "write": write.to(dev),
            "last": (firsts + lens - 1).to(dev),
            "groups": [{k: v.to(dev) for k, v in g.items()} for g in groups],
        }

    def _group(
        self,
        idx: torch.Tensor,
        starts: torch.Tensor,
        lens: torch.Tensor,
        table: torch.Tensor,
        firsts: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """One attention call's indices: the runs ``idx``, queries and keys padded to their longest."""
        b = self.block_size
        st, ln, fi = starts[idx], lens[idx], firsts[idx]
        ctx = st + ln
        keys = torch.arange(int(ctx.max()))
        gather = table[idx][:, keys // b] * b + keys % b  # [runs, max_ctx] slot of each position
        q_off = torch.arange(int(ln.max()))
        q_pos = st[:, None] + q_off[None, :]
        q_valid = q_off[None, :] < ln[:, None]
        mask = (keys[None, None, :] <= q_pos[:, :, None]) & q_valid[:, :, None]
        mask[:, :, 0] |= ~q_valid  # padding queries see one key (no NaN); their rows are dropped
        q_index = torch.where(q_valid, fi[:, None] + q_off[None, :], 0)
        rows = torch.nonzero(q_valid.reshape(-1)).reshape(-1)  # padded [runs * max_q] -> valid
        return {"gather": gather, "mask": mask[:, None], "q_index": q_index, "rows": rows,
                "dest": q_index.reshape(-1)[rows]}  # fmt: skip

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, runs: Sequence[Run]) -> torch.Tensor:
        """Logits ``[len(runs), vocab]`` (float32) at each run's last token."""
        if not runs:
            return torch.empty((0, self.vocab_size))
        lay = self._layout(runs)
        if self.kind == "gpt2":
            t = self.model.transformer
            h = t.wte(lay["ids"]) + t.wpe(lay["pos"])
            for i, block in enumerate(self.layers):
                a = block.ln_1(h)
                q, k, v = block.attn.c_attn(a).split(self.heads * self.head_dim, dim=-1)
                o = self._attend(i, q, k, v, lay, float(block.attn.scaling))
                h = h + block.attn.c_proj(o)
                h = h + block.mlp(block.ln_2(h))
            h = t.ln_f(h[lay["last"]])
        else:
            m = self.model.model
            h = m.embed_tokens(lay["ids"])
            cos, sin = m.rotary_emb(h[None], lay["pos"][None])
            cos, sin = cos[0][:, None, :], sin[0][:, None, :]  # [tokens, 1, head_dim]
            for i, layer in enumerate(self.layers):
                a = layer.input_layernorm(h)
                att = layer.self_attn
                n = a.shape[0]
                q = att.q_proj(a).view(n, self.heads, self.head_dim)
                k = att.k_proj(a).view(n, self.kv_heads, self.head_dim)
                q, k = _rope(q, cos, sin), _rope(k, cos, sin)
                o = self._attend(i, q, k, att.v_proj(a), lay, float(att.scaling))
                h = h + att.o_proj(o)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            h = m.norm(h[lay["last"]])
        return self.model.lm_head(h).float()

    def _attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lay: dict[str, Any],
        scale: float,
    ) -> torch.Tensor:
        """Write this step's keys/values into their slots, attend over each sequence's context."""
        n = q.shape[0]
        kp, vp = self.k_pool[layer], self.v_pool[layer]
        kp[lay["write"]] = k.reshape(n, self.kv_heads, self.head_dim)
        vp[lay["write"]] = v.reshape(n, self.kv_heads, self.head_dim)
        flat_q = q.reshape(n, self.heads, self.head_dim)
        out = q.new_empty((n, self.heads * self.head_dim))
        for g in lay["groups"]:
            # [runs, heads, ctx, dim] gathered from the pool (a read; the cache itself never moves)
            keys = kp[g["gather"]].permute(0, 2, 1, 3)
            values = vp[g["gather"]].permute(0, 2, 1, 3)
            if self.kv_heads != self.heads:
                rep = self.heads // self.kv_heads
                keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
            queries = flat_q[g["q_index"]].permute(0, 2, 1, 3)  # [runs, heads, max_q, dim]
            o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=g["mask"], scale=scale)
            out[g["dest"]] = o.permute(0, 2, 1, 3).reshape(-1, self.heads * self.head_dim)[g["rows"]]
        return out


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's apply_rotary_pos_emb for one tensor laid out [tokens, heads, dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
