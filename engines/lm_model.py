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

# A decode attention call pads its contexts to its longest; one more call costs a few small
# ops per layer, taken here as worth about this many padded key rows (an estimate: on the
# shared CPU 256 to 1e6 measured alike within its noise; tests set 0, one call per context).
PAD_LIMIT = 512

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
        """Token ids, positions and write slots of a step, and its attention groups.

        Built once per step (shared by every layer) from plain lists, so a step's Python
        work does not grow with its layers. Decodes (one query each) are attended together,
        in buckets of similar context length (padding a 20-token context to a 180-token
        one would read 9x the keys it needs); each prefill chunk alone, so one long chunk
        does not pad every decode's queries to its length."""
        b = self.block_size
        lens = [len(r.tokens) for r in runs]
        ids: list[int] = []
        pos: list[int] = []
        write: list[int] = []
        last: list[int] = []
        decodes: list[tuple[int, int, Sequence[int]]] = []  # (flat row, context, blocks)
        prefills: list[tuple[int, Run]] = []  # (first flat row, run)
        for run, n in zip(runs, lens, strict=True):
            first = len(ids)
            ids.extend(run.tokens)
            table = run.blocks
            for p in range(run.start, run.start + n):
                write.append(table[p // b] * b + p % b)
            pos.extend(range(run.start, run.start + n))
            last.append(first + n - 1)
            if n == 1:
                decodes.append((first, run.start + 1, table))
            else:
                prefills.append((first, run))
        dev = self.device
        groups = [self._decode_group(bucket) for bucket in _buckets(decodes)]
        groups += [self._prefill_group(first, run) for first, run in prefills]
        as_long = {"dtype": torch.long, "device": dev}
        return {
            "ids": torch.tensor(ids, **as_long),
            "pos": torch.tensor(pos, **as_long),
            "write": torch.tensor(write, **as_long),
            "last": torch.tensor(last, **as_long),
            # every row's own output: one decode bucket covering the whole step needs no scatter
            "whole": len(groups) == 1 and not prefills,
            "groups": groups,
        }

    def _decode_group(self, bucket: Sequence[tuple[int, int, Sequence[int]]]) -> dict[str, Any]:
        """One attention call over decodes: each query sees its own context's keys.

        Keys are read from the pool a whole block at a time (one ``index_select`` of
        ``block_size`` rows per block, not one per position) into ``[runs, ctx, heads,
        dim]``; the key positions past a run's context are masked out."""
        b = self.block_size
        ctx = max(c for _, c, _ in bucket)
        width = -(-ctx // b)
        blocks = [list(t[:width]) + [0] * (width - len(t[:width])) for _, _, t in bucket]
        lengths = torch.tensor([c for _, c, _ in bucket])
        mask = torch.arange(ctx)[None, :] < lengths[:, None]  # [runs, ctx]
        dev = self.device
        rows = torch.tensor([f for f, _, _ in bucket], dtype=torch.long, device=dev)
        return {
            "blocks": torch.tensor(blocks, dtype=torch.long, device=dev).reshape(-1),
            "runs": len(bucket), "width": width, "ctx": ctx,
            "mask": mask[:, None, None, :].to(dev), "rows": rows,
        }  # fmt: skip

    def _prefill_group(self, first: int, run: Run) -> dict[str, Any]:
        """One attention call over one prefill chunk: query ``i`` at position ``p`` sees keys ``0..p``."""
        b = self.block_size
        n = len(run.tokens)
        ctx = run.start + n
        width = -(-ctx // b)
        keys = torch.arange(ctx)
        q_pos = torch.arange(run.start, ctx)
        mask = keys[None, :] <= q_pos[:, None]  # [queries, ctx]
        dev = self.device
        return {
            "blocks": torch.tensor(list(run.blocks[:width]), dtype=torch.long, device=dev),
            "runs": 1, "width": width, "ctx": ctx,
            "mask": mask[None, None].to(dev),
            "rows": torch.arange(first, first + n, device=dev),
        }  # fmt: skip

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
        kvh, hd, heads = self.kv_heads, self.head_dim, self.heads
        kp, vp = self.k_pool[layer], self.v_pool[layer]
        kp.index_copy_(0, lay["write"], k.reshape(n, kvh, hd))
        vp.index_copy_(0, lay["write"], v.reshape(n, kvh, hd))
        k_blocks, v_blocks = kp.view(self.num_blocks, -1), vp.view(self.num_blocks, -1)
        flat_q = q.reshape(n, heads, hd)
        out = None if lay["whole"] else q.new_empty((n, heads * hd))
        for g in lay["groups"]:
            runs, span, ctx = g["runs"], g["width"] * self.block_size, g["ctx"]
            # [runs, kv heads, ctx, dim], read whole blocks at a time (the cache never moves)
            keys = k_blocks.index_select(0, g["blocks"]).view(runs, span, kvh, hd)[:, :ctx].transpose(1, 2)
            values = v_blocks.index_select(0, g["blocks"]).view(runs, span, kvh, hd)[:, :ctx].transpose(1, 2)
            if kvh != heads:
                rep = heads // kvh
                keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
            queries = flat_q.index_select(0, g["rows"]).view(runs, -1, heads, hd).transpose(1, 2)
            o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=g["mask"], scale=scale)
            o = o.transpose(1, 2).reshape(-1, heads * hd)  # rows in g["rows"] order
            if out is None:
                return o
            out.index_copy_(0, g["rows"], o)
        assert out is not None
        return out


def _buckets(decodes: Sequence[tuple[int, int, Sequence[int]]]) -> list[list[tuple[int, int, Sequence[int]]]]:
    """Decodes split into attention calls of similar context length, each in step order.

    Padding every decode to the longest context reads (and attends over) keys it does not
    need; one more call costs a few small ops per layer. Walking the contexts in ascending
    order, a new call starts where joining the current one would pad more than
    ``PAD_LIMIT`` key rows."""
    if not decodes:
        return []
    ranked = sorted(decodes, key=lambda d: d[1])
    buckets = [[ranked[0]]]
    for d in ranked[1:]:
        bucket = buckets[-1]
        if len(bucket) * (d[1] - bucket[-1][1]) > PAD_LIMIT:
            buckets.append([d])
        else:
            bucket.append(d)
    return [sorted(bucket, key=lambda d: d[0]) for bucket in buckets]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's apply_rotary_pos_emb for one tensor laid out [tokens, heads, dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
