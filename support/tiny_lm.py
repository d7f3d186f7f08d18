"""Tiny random-weight causal LM folders (GPT-2 or Llama shape), built offline.

What tests, benchmarks and the LLM example serve: a Hugging Face model folder as a user
has one (``config.json``, ``model.safetensors``, ``generation_config.json``, tokenizer
files), written by ``save_pretrained``. The tokenizer is a byte-level BPE trained by the
``tokenizers`` library on a few sentences, so any text encodes and nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "energy per token is what batching decides",
    "a server that schedules tokens, not requests",
    "hello world, hello tokens, hello batches",
]
EOS = "<|endoftext|>"
# A chat template for the folder when asked for one (the tokenizer_config.json field).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab_size: int = 320, chat_template: bool = False):
    """A byte-level BPE tokenizer (transformers' fast tokenizer around it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_lm(
    folder: Path,
    kind: str = "gpt2",
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    context: int = 512,
    chat_template: bool = False,
) -> Path:
    """Write a random-weight ``kind`` ('gpt2' or 'llama') model folder; returns ``folder``."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    tokenizer = build_tokenizer(chat_template=chat_template)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    vocab = len(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "gpt2":
            config = GPT2Config(
                vocab_size=vocab,
                n_positions=context,
                n_embd=hidden,
                n_layer=layers,
                n_head=heads,
                initializer_range=0.2,  # GPT-2's 0.02 repeats one token forever
                bos_token_id=eos,
                eos_token_id=eos,
            )
            model = GPT2LMHeadModel(config)
        elif kind == "llama":
            config = LlamaConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=hidden * 2,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2),  # grouped-query attention
                max_position_embeddings=context,
                bos_token_id=eos,
                eos_token_id=eos,
            )
            model = LlamaForCausalLM(config)
        else:
            raise ValueError(f"kind must be 'gpt2' or 'llama', got {kind!r}")
    model.generation_config.pad_token_id = eos
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
