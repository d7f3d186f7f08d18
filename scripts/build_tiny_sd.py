"""Build a tiny Stable Diffusion folder with random weights, offline, in seconds.

    python scripts/build_tiny_sd.py OUT_DIR [--seed 0]

The folder is what ``StableDiffusionPipeline.save_pretrained`` writes (``model_index.json``,
``text_encoder/``, ``tokenizer/``, ``unet/``, ``vae/``, ``scheduler/``), so wattserve loads it
exactly as it loads a published checkpoint, with ``from_pretrained(..., local_files_only=True)``.
Every part is small: a 2-layer CLIP text model (hidden 32, 32 positions), a CLIP BPE
tokenizer whose vocabulary and merges this script learns from a few sentences, a
2-level conditional UNet (32 / 48 channels, attention on the 8x8 level, width 32, 16x16
latents), a 2-level VAE without mid-block attention (32x32 images) and a DDIM scheduler
with Stable Diffusion's betas. About 3.5 MB on disk; nothing is downloaded. Tests and
benchmarks build it into a temporary folder; never commit its output.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from itertools import pairwise
from pathlib import Path

import torch

TEXT_POSITIONS = 32  # the tokenizer's model_max_length and the text model's positions
CROSS_DIM = 32  # text hidden size = the UNet's cross-attention width
CORPUS = (
    "a photo of a cat sitting on a red chair . a painting of a dog in the snow . "
    "an astronaut riding a horse on the moon . a blue house by the sea at sunset . "
    "the quick brown fox jumps over the lazy dog"
)
MERGES = 60  # BPE merges learned from CORPUS


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def learn_bpe(corpus: str, merges: int) -> list[tuple[str, str]]:
    """Plain BPE over CLIP's word form (last symbol carries ``</w>``): the ``merges`` most
    frequent pairs, merged one after another."""
    words = Counter(corpus.lower().split())
    symbols = {w: [*w[:-1], w[-1] + "</w>"] for w in words}
    learned: list[tuple[str, str]] = []
    for _ in range(merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            s = symbols[word]
            for pair in pairwise(s):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        learned.append(best)
        for word, s in symbols.items():
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            symbols[word] = out
    return learned


def write_tokenizer_files(folder: Path) -> int:
    """vocab.json + merges.txt of a small CLIP BPE vocabulary; returns the vocabulary size."""
    folder.mkdir(parents=True, exist_ok=True)
    base = list(bytes_to_unicode().values())
    merges = learn_bpe(CORPUS, MERGES)
    tokens = [*base, *(c + "</w>" for c in base), *("".join(m) for m in merges)]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    lines = ["#version: 0.2", *(f"{a} {b}" for a, b in merges)]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(vocab)


def build(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny pipeline to ``out_dir``; returns it."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_size = write_tokenizer_files(Path(tmp))
        tokenizer = CLIPTokenizer(
            str(Path(tmp) / "vocab.json"),
            str(Path(tmp) / "merges.txt"),
            pad_token="<|endoftext|>",
            model_max_length=TEXT_POSITIONS,
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=vocab_size,
                hidden_size=CROSS_DIM,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=TEXT_POSITIONS,
                bos_token_id=vocab_size - 2,
                eos_token_id=vocab_size - 1,
                pad_token_id=vocab_size - 1,
            )
        )
        unet = UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(32, 48),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=CROSS_DIM,
            attention_head_dim=8,
            norm_num_groups=8,
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            block_out_channels=(16, 32),
            latent_channels=4,
            norm_num_groups=8,
            sample_size=32,
            mid_block_add_attention=False,
        )
    # A random UNet makes DDIM's trajectory chaotic (engines/diffusion.py TINY_OUTPUT_SCALE):
    # scale its output layer down so batch-size float noise stays small.
    with torch.no_grad():
        unet.conv_out.weight.mul_(0.1)
        unet.conv_out.bias.mul_(0.1)
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    path = build(args.out_dir, args.seed)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"tiny Stable Diffusion pipeline in {path} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
