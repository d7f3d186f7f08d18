"""Build a small local language-model folder, serve it with token-level batching, call it.

    python examples/llm/serve_tiny_lm.py [--folder /tmp/tiny-lm] [--kind gpt2|llama]

The folder is a Hugging Face model folder as a user has one (``config.json``,
``model.safetensors``, tokenizer files, a chat template), with random weights: built
offline by ``support/tiny_lm.py``, so its text is noise, but every route answers as it
would for a real model. The server is ``wattserve serve --model FOLDER --batcher
continuous``; the calls are Triton's generate, a streamed generate, and the ``openai``
client's completion and chat completion.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # support/ lives in the checkout, not in the installed package

from wattserve.loadgen.server_process import running_wattserve  # noqa: E402

from support.tiny_lm import build_tiny_lm  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=Path("/tmp/wattserve-example/tiny-lm"))
    ap.add_argument("--kind", choices=("gpt2", "llama"), default="llama")
    args = ap.parse_args(argv)
    if not (args.folder / "config.json").is_file():
        build_tiny_lm(args.folder, args.kind, chat_template=True)
        print(f"built {args.folder}")
    name = args.folder.name
    env = {"WATTSERVE_MODEL": str(args.folder), "WATTSERVE_BATCHER": "continuous", "WATTSERVE_DEVICE": "cpu"}
    answers: dict = {}
    with running_wattserve(env) as server:
        url = server.url
        body = {"text_input": "hello tokens", "max_tokens": 8, "temperature": 0}
        answers["generate"] = httpx.post(f"{url}/v2/models/{name}/generate", json=body, timeout=60).json()
        with httpx.stream("POST", f"{url}/v2/models/{name}/generate_stream", json=body, timeout=60) as r:
            answers["stream"] = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        answers["completion"] = client.completions.create(
            model=name, prompt="hello", max_tokens=6
        ).model_dump()
        chat = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=6, seed=1
        )
        answers["chat"] = chat.model_dump()
    print(json.dumps({"generate": answers["generate"], "stream_events": len(answers["stream"]),
                      "completion_usage": answers["completion"]["usage"],
                      "chat_usage": answers["chat"]["usage"]}, indent=2))  # fmt: skip
    return answers


if __name__ == "__main__":
    main()
