"""Triton's classification extension: an output asked for as its top K classes.

A client asks with the output parameter ``classification: K`` (HTTP JSON), or
``parameters["classification"].int64_param`` (gRPC; tritonclient's
``InferRequestedOutput(name, class_count=K)``). The output comes back as BYTES, ``[batch, K]``
for a batching model (``[K]`` for one with max_batch_size 0), each element
``"<value>:<index>"`` or ``"<value>:<index>:<label>"``, largest value first, the labels read
from the output's ``label_filename`` (a file in the model's directory, one label per line).

This mirrors Triton's server ``src/classification.cc`` and ``src/http_server.cc``: the value
printed as C++ ``std::to_string`` prints it (``%f`` for FP32/FP64, the integer for integer
types), K clipped to the number of classes, the classifiable types and the 1,000,000-class
bound. Where Triton leaves ties to ``std::sort`` (unspecified order), the lower index comes
first here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

PARAMETER = "classification"
# Triton's classifiable datatypes (TopkClassifications); BOOL, FP16, BF16 and BYTES are not.
CLASSIFIABLE = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}
)
MAX_CLASSES = 1_000_000  # Triton's kMaxClassificationElements: bounds the sort's CPU and memory


def class_count(output: str, value: Any) -> int:
    """The K an output's ``classification`` parameter asks for; ValueError unless a positive
    integer (gRPC Triton refuses <= 0 alike; JSON true/false are not counts)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"output {output!r}: parameter 'classification' must be a positive integer "
            f"(the number of classes), got {value!r}"
        )
    return value


def check_classifiable(output: str, datatype: str, element_count: int | None = None) -> None:
    """Refuse, before any compute, what Triton refuses after it: an unclassifiable datatype,
    or more than ``MAX_CLASSES`` classes per row (when the row size is known)."""
    if datatype not in CLASSIFIABLE:
        raise ValueError(
            f"output {output!r}: class result not available for output due to unsupported type '{datatype}'"
        )
    if element_count is not None and element_count > MAX_CLASSES:
        raise ValueError(f"output {output!r}: classification output tensor too large")


def top_k_strings(array: np.ndarray, k: int, labels: Sequence[str] | None, batched: bool) -> np.ndarray:
    """The top ``k`` classes of ``array`` as a numpy object array of ``bytes``: ``[rows, K']``
    when ``batched`` (axis 0 is the batch, each row's other axes flattened), else ``[K']``
    over the whole tensor, with K' = min(k, classes)."""
    rows = array.reshape(len(array), -1) if batched and array.ndim > 0 else array.reshape(1, -1)
    classes = rows.shape[1]
    if classes > MAX_CLASSES:
        raise ValueError("classification output tensor too large")
    kept = min(k, classes)
    fmt = _formatter(array.dtype)
    out = np.empty((rows.shape[0], kept), dtype=object)
    for r, row in enumerate(rows):
        # descending, ties by ascending index: a stable ascending sort of the reversed row
        order = (classes - 1 - np.argsort(row[::-1], kind="stable"))[::-1][:kept]
        for j, index in enumerate(order.tolist()):
            text = f"{fmt(row[index])}:{index}"
            label = labels[index] if labels is not None and index < len(labels) else ""
            if label:  # Triton appends a label only where there is one
                text += f":{label}"
            out[r, j] = text.encode()
    return out if batched and array.ndim > 0 else out[0]


def _formatter(dtype: np.dtype) -> Callable[[Any], str]:
    """C++ ``std::to_string``: ``%f`` for floating point, the plain integer otherwise."""
    if dtype.kind == "f":
        return lambda v: "%f" % float(v)  # noqa: UP031 - printf's %f is the reference
    return lambda v: str(int(v))


# ---------------------------------------------------------------------------- labels


def read_labels(path: Path) -> list[str]:
    """One label per line, as Triton's LabelProvider reads them (a trailing newline ends the
    last line, it adds no empty label); a carriage return before the newline is dropped."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


class ClassLabels:
    """The labels of a model's outputs (``label_filename`` in config.pbtxt, relative to the
    model's directory), read once when the model loads: ``loading(factory)`` wraps the engine
    factory, so a missing label file fails the load and names the file, as in Triton."""

    def __init__(self, config: Any, model_dir: Path | None) -> None:
        self._files = {
            o.name: Path(model_dir) / o.label_filename
            for o in (config.output if config is not None else ())
            if o.label_filename and model_dir is not None
        }
        self._labels: dict[str, list[str]] | None = None if self._files else {}

    def load(self) -> None:
        if self._labels is not None:
            return
        labels = {}
        for output, path in self._files.items():
            try:
                labels[output] = read_labels(path)
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"output {output!r}: label_filename {path}: {exc}") from None
        self._labels = labels

    def loading(self, factory: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def build(settings: Any) -> Any:
            self.load()
            return factory(settings)

        return build

    def get(self, output: str) -> list[str] | None:
        return (self._labels or {}).get(output)

    @property
    def by_output(self) -> Mapping[str, list[str]]:
        return self._labels or {}
