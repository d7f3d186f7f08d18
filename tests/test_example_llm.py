"""examples/llm/serve_tiny_lm.py runs as a user would run it and every call answers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_llm_example_builds_serves_and_answers(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "serve_tiny_lm", ROOT / "examples" / "llm" / "serve_tiny_lm.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    answers = example.main(["--folder", str(tmp_path / "tiny-lm"), "--kind", "gpt2"])
    assert answers["generate"]["model_name"] == "tiny-lm"
    assert len(answers["generate"]["output_ids"]) == 8
    assert [e["output_ids"] for e in answers["stream"]] == answers["generate"]["output_ids"]  # greedy both
    assert answers["completion"]["usage"]["completion_tokens"] == 6
    assert answers["chat"]["choices"][0]["message"]["role"] == "assistant"
