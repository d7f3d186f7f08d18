"""server.extensions.classification: Triton's top-K strings, exactly as its server prints them
(src/classification.cc: ``std::to_string(value) + ":" + std::to_string(index)`` and
``":" + label`` where there is one), and the labels file read as Triton reads it."""

from __future__ import annotations

import numpy as np
import pytest
from wattserve.server.extensions.classification import (
    ClassLabels,
    check_classifiable,
    class_count,
    read_labels,
    top_k_strings,
)
from wattserve.server.models.repository import model_config_pb2 as pb


def test_batched_rows_sorted_descending_with_labels():
    scores = np.array([[0.1, 0.7, 0.2], [3.0, -1.0, 2.5]], dtype=np.float32)
    got = top_k_strings(scores, 2, ["cat", "dog", "eel"], batched=True)
    assert got.shape == (2, 2) and got.dtype == object
    assert got.tolist() == [[b"0.700000:1:dog", b"0.200000:2:eel"], [b"3.000000:0:cat", b"2.500000:2:eel"]]


def test_unbatched_is_one_list_over_the_whole_tensor():
    scores = np.array([[1.0, 4.0], [3.0, 2.0]], dtype=np.float64)
    got = top_k_strings(scores, 3, None, batched=False)
    assert got.tolist() == [b"4.000000:1", b"3.000000:2", b"2.000000:3"]


def test_k_is_clipped_to_the_number_of_classes():
    got = top_k_strings(np.array([[1, 2]], dtype=np.int32), 5, None, batched=True)
    assert got.tolist() == [[b"2:1", b"1:0"]]


@pytest.mark.parametrize(
    ("dtype", "value", "text"),
    [
        (np.float32, 0.1, "0.100000"),  # %f of the float widened to double, as C++ prints it
        (np.float32, 1e-7, "0.000000"),
        (np.float64, 123456.789, "123456.789000"),
        (np.float32, -np.inf, "-inf"),
        (np.int8, -5, "-5"),
        (np.uint8, 200, "200"),
        (np.uint64, 2**64 - 1, "18446744073709551615"),
        (np.int64, -(2**63), "-9223372036854775808"),
    ],
)
def test_value_printed_as_std_to_string(dtype, value, text):
    got = top_k_strings(np.array([value], dtype=dtype), 1, None, batched=False)
    assert got.tolist() == [f"{text}:0".encode()]


def test_unsigned_sort_does_not_wrap_and_ties_keep_index_order():
    values = np.array([[0, 2**32 - 1, 7, 7]], dtype=np.uint32)
    assert top_k_strings(values, 4, None, batched=True).tolist() == [
        [b"4294967295:1", b"7:2", b"7:3", b"0:0"]
    ]


def test_missing_or_empty_labels_add_nothing():
    got = top_k_strings(np.array([1.0, 3.0, 2.0], np.float32), 3, ["a", ""], batched=False)
    assert got.tolist() == [b"3.000000:1", b"2.000000:2", b"1.000000:0:a"]


def test_class_count_must_be_a_positive_integer():
    assert class_count("out", 3) == 3
    for bad in (0, -1, True, 2.0, "3", None):
        with pytest.raises(ValueError, match="positive integer"):
            class_count("out", bad)


def test_unclassifiable_types_and_too_many_classes_refused():
    for datatype in ("BOOL", "FP16", "BF16", "BYTES"):
        with pytest.raises(ValueError, match=f"unsupported type '{datatype}'"):
            check_classifiable("out", datatype)
    check_classifiable("out", "FP32", 1_000_000)
    with pytest.raises(ValueError, match="too large"):
        check_classifiable("out", "FP32", 1_000_001)
    with pytest.raises(ValueError, match="too large"):
        top_k_strings(np.zeros(1_000_001, np.float32), 1, None, batched=False)


def test_labels_file_read_once_at_load(tmp_path):
    (tmp_path / "labels.txt").write_text("zero\r\none\ntwo\n")
    assert read_labels(tmp_path / "labels.txt") == ["zero", "one", "two"]
    config = pb.ModelConfig()
    config.output.add(name="scores", label_filename="labels.txt")
    config.output.add(name="other")
    labels = ClassLabels(config, tmp_path)
    built = labels.loading(lambda settings: ("engine", settings))("s")
    assert built == ("engine", "s")
    (tmp_path / "labels.txt").write_text("changed\n")  # read once: a later edit is not seen
    assert labels.get("scores") == ["zero", "one", "two"] and labels.get("other") is None


def test_missing_labels_file_fails_the_load_naming_it(tmp_path):
    config = pb.ModelConfig()
    config.output.add(name="scores", label_filename="nope.txt")
    factory = ClassLabels(config, tmp_path).loading(lambda settings: "engine")
    with pytest.raises(ValueError, match=r"nope\.txt"):
        factory(None)
