"""Hypothesis strategies for hostile KServe v2 infer bodies, shared by the JSON fuzz test
(tests/test_fuzz_json.py) and the reliability suite's fuzz probe.

A fuzzed body starts from a valid request for the served model and applies a few
mutations where a client is most likely to be wrong: a wrong type where a name, shape,
datatype, parameters or data belongs (booleans in ``shape``, lists or objects where a
string belongs, huge integers, NaN/Infinity tokens), fields deleted, deep nesting, and
occasionally a truncated body or a bogus binary-extension header. Every such body must
get a 4xx JSON error or a 200, never a 5xx; the one exception is a 504 for a body that set
a (microseconds-short) deadline of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

DATA_SENTINEL = "__wattserve_data__"  # replaced by pre-serialized data (big inputs cost nothing)
DELETE = object()

# Where a mutation may land: a path into the valid body; () is the whole document.
SLOTS: list[tuple[Any, ...]] = [
    (),
    ("inputs",),
    ("inputs", 0),
    ("inputs", 0, "name"),
    ("inputs", 0, "shape"),
    ("inputs", 0, "shape", 0),
    ("inputs", 0, "shape", -1),
    ("inputs", 0, "datatype"),
    ("inputs", 0, "parameters"),
    ("inputs", 0, "parameters", "binary_data_size"),
    ("inputs", 0, "data"),
    ("inputs", 0, "data", 0),
    ("outputs",),
    ("outputs", 0),
    ("outputs", 0, "name"),
    ("outputs", 0, "parameters"),
    ("outputs", 0, "parameters", "binary_data"),
    ("parameters",),
    ("parameters", "priority"),
    ("parameters", "timeout"),
    ("parameters", "binary_data_output"),
    ("id",),
]


@dataclass(frozen=True)
class ModelShape:
    """What a valid body for the served model looks like (one input, one output)."""

    input_name: str
    output_name: str
    item_shape: tuple[int, ...]
    datatype: str = "FP32"

    @property
    def count(self) -> int:
        n = 1
        for d in self.item_shape:
            n *= d
        return n


IDENTITY = ModelShape("INPUT0", "OUTPUT0", (16,))
MOBILENET_V2 = ModelShape("input", "logits", (3, 224, 224))


@dataclass
class FuzzCase:
    body: bytes
    headers: dict[str, str]
    mutations: list[str]

    def sets_deadline(self) -> bool:
        """Whether the body asks for a deadline (``parameters.timeout`` > 0 microseconds):
        then a 504 is the right answer once it passed, not a server fault."""
        try:
            doc = json.loads(self.body)
        except ValueError:
            return False
        params = doc.get("parameters") if isinstance(doc, dict) else None
        timeout = params.get("timeout") if isinstance(params, dict) else None
        return isinstance(timeout, int) and not isinstance(timeout, bool) and timeout > 0

    def describe(self) -> str:
        preview = self.body[:400].decode(errors="replace")
        more = f" ...(+{len(self.body) - 400} bytes)" if len(self.body) > 400 else ""
        return f"mutations={self.mutations} headers={self.headers} body={preview}{more}"


def valid_doc(model: ModelShape, batched: bool) -> dict[str, Any]:
    shape = [1, *model.item_shape] if batched else list(model.item_shape)
    return {
        "id": "fuzz",
        "inputs": [{"name": model.input_name, "shape": shape, "datatype": model.datatype,
                    "parameters": {}, "data": DATA_SENTINEL}],
        "outputs": [{"name": model.output_name, "parameters": {"binary_data": False}}],
        "parameters": {"priority": 0},
    }  # fmt: skip


def _scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63) - 1, 10**30, 2**64]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([1e308, -1e308, 1e-320, 3.4e38, 3.5e38]),
        st.text(max_size=12),
        st.sampled_from(["FP32", "FP16", "INT64", "BYTES", "BOOL", "INPUT0", "input", "*", ""]),
    )


def _nested(depth: int) -> Any:
    value: Any = 0
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def odd_values() -> st.SearchStrategy[Any]:
    """Anything that may turn up where a client is wrong."""
    scalars = _scalars()
    return st.one_of(
        scalars,
        st.lists(scalars, max_size=5),
        st.dictionaries(st.text(max_size=6), scalars, max_size=4),
        st.lists(st.lists(scalars, max_size=3), max_size=3),
        st.lists(st.booleans(), min_size=1, max_size=4),  # booleans in shape
        st.sampled_from([0, 1, 2, 50, 500]).map(_nested),
        st.just(DELETE),
    )


def _apply(doc: Any, path: tuple[Any, ...], value: Any) -> bool:
    """Set (or delete) ``path`` in ``doc``; False where the path no longer exists."""
    node = doc
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return False
    key = path[-1]
    if isinstance(node, dict) and isinstance(key, str):
        if value is DELETE:
            node.pop(key, None)
        else:
            node[key] = value
        return True
    if isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
        if value is DELETE:
            node.pop(key)
        else:
            node[key] = value
        return True
    return False


def _serialize(doc: Any, data_json: str) -> bytes:
    text = json.dumps(doc, allow_nan=True)  # NaN / Infinity tokens are part of the fuzz
    return text.replace(json.dumps(DATA_SENTINEL), data_json).encode()


@st.composite
def fuzz_cases(draw: st.DrawFn, model: ModelShape, data_json: str | None = None) -> FuzzCase:
    """A mutated infer body (and headers) for ``model``.

    ``data_json`` is the serialized valid ``data`` list (precompute it once per model).
    """
    data_json = data_json if data_json is not None else valid_data_json(model)
    batched = draw(st.booleans())
    doc: Any = valid_doc(model, batched)
    mutations: list[str] = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        path = draw(st.sampled_from(SLOTS))
        value = draw(odd_values())
        if not path:
            doc = {"inputs": doc} if value is DELETE else value
            mutations.append(f"document={_short(value)}")
        elif _apply(doc, path, value):
            mutations.append(f"{'/'.join(map(str, path))}={_short(value)}")
    body = _serialize(doc, data_json)
    headers = {"Content-Type": "application/json"}
    tail = draw(st.sampled_from(["none", "none", "none", "none", "truncate", "binary_header"]))
    if tail == "truncate" and len(body) > 1:
        cut = draw(st.integers(min_value=0, max_value=len(body) - 1))
        body = body[:cut]
        mutations.append(f"truncated at {cut}")
    elif tail == "binary_header":
        header_value = draw(st.one_of(st.integers(-5, len(body) + 5).map(str), st.text(max_size=6)))
        header_value = "".join(c for c in header_value if 32 < ord(c) < 127) or "x"
        headers["Inference-Header-Content-Length"] = header_value
        body += draw(st.binary(max_size=16))
        mutations.append(f"Inference-Header-Content-Length={header_value!r}")
    return FuzzCase(body, headers, mutations)


def valid_data_json(model: ModelShape) -> str:
    return json.dumps([0.5] * model.count)


def _short(value: Any) -> str:
    if value is DELETE:
        return "<deleted>"
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 60 else text[:57] + "..."
