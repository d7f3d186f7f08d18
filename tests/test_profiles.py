"""Profile planning, bucket selection, padding/slicing and plan cache keys (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest
from wattserve.engines.profiles import (
    BatchProfile,
    batch_length,
    choose_bucket,
    default_buckets,
    file_sha256,
    format_profiles,
    normalize_buckets,
    pad_batch,
    parse_profiles,
    plan_cache_key,
    plan_file_name,
    profiles_max_batch,
    profiles_opt_sizes,
    select_profile,
)

DEFAULT = "1:1:1,2:4:8,8:16:32"


def test_parse_default_profiles_keeps_order():
    profiles = parse_profiles(DEFAULT)
    assert profiles == [BatchProfile(1, 1, 1), BatchProfile(2, 4, 8), BatchProfile(8, 16, 32)]
    assert format_profiles(profiles) == DEFAULT
    assert parse_profiles(" 8:16:32 , 1:1:1 ")[0] == BatchProfile(8, 16, 32)


@pytest.mark.parametrize(
    "text",
    ["", "1:2", "1:2:3:4", "a:1:2", "0:1:1", "4:2:8", "1:9:8", "1:1:1,1:1:1", "2:1:1"],
)
def test_parse_rejects_bad_profiles(text):
    with pytest.raises(ValueError):
        parse_profiles(text)


def test_max_and_opt_sizes():
    profiles = parse_profiles(DEFAULT)
    assert profiles_max_batch(profiles) == 32
    assert profiles_opt_sizes(profiles) == [1, 4, 16]


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (1, (0, 1)),
        (2, (1, 2)),
        (5, (1, 5)),
        # 8 is in both 2:4:8 and 8:16:32; the narrower range (2..8) wins.
        (8, (1, 8)),
        (9, (2, 9)),
        (32, (2, 32)),
    ],
)
def test_select_profile_default(batch, expected):
    assert select_profile(batch, parse_profiles(DEFAULT)) == expected


def test_every_size_runs_unpadded_when_profiles_cover_the_range():
    profiles = parse_profiles(DEFAULT)
    for n in range(1, 33):
        index, run = select_profile(n, profiles)
        assert run == n
        assert profiles[index].contains(n)


def test_gap_between_profiles_pads_up_to_next_min():
    profiles = parse_profiles("1:1:2,8:8:8,16:24:32")
    assert select_profile(3, profiles) == (1, 8)
    assert select_profile(7, profiles) == (1, 8)
    assert select_profile(9, profiles) == (2, 16)
    assert select_profile(2, profiles) == (0, 2)


def test_equal_width_profiles_prefer_nearest_opt():
    profiles = parse_profiles("1:2:8,4:8:8")
    # 7 is in both; widths 7 and 4: narrower (index 1) wins.
    assert select_profile(7, profiles) == (1, 7)
    profiles = parse_profiles("1:1:8,1:8:8")
    assert select_profile(7, profiles) == (1, 7)
    assert select_profile(2, profiles) == (0, 2)


def test_select_profile_rejects_out_of_range():
    profiles = parse_profiles(DEFAULT)
    with pytest.raises(ValueError, match="exceeds"):
        select_profile(33, profiles)
    with pytest.raises(ValueError):
        select_profile(0, profiles)


def test_buckets():
    assert default_buckets(1) == [1]
    assert default_buckets(8) == [1, 2, 4, 8]
    assert default_buckets(12) == [1, 2, 4, 8, 12]
    assert normalize_buckets([8, 1, 4, 4]) == [1, 4, 8]
    with pytest.raises(ValueError):
        normalize_buckets([])
    with pytest.raises(ValueError):
        normalize_buckets([0, 4])
    buckets = [1, 4, 8]
    assert [choose_bucket(n, buckets) for n in range(1, 9)] == [1, 4, 4, 4, 8, 8, 8, 8]
    with pytest.raises(ValueError):
        choose_bucket(9, buckets)
    with pytest.raises(ValueError):
        choose_bucket(0, buckets)


def test_pad_repeats_last_item():
    rng = np.random.default_rng(0)
    batch = {
        "input": rng.standard_normal((3, 2, 2)).astype(np.float32),
        "ids": np.array([[5], [6], [7]], dtype=np.int64),
    }
    padded = pad_batch(batch, 5)
    assert padded["input"].shape == (5, 2, 2)
    assert padded["input"].dtype == np.float32
    np.testing.assert_array_equal(padded["input"][:3], batch["input"])
    np.testing.assert_array_equal(padded["input"][3], batch["input"][2])
    np.testing.assert_array_equal(padded["ids"][:, 0], [5, 6, 7, 7, 7])
    assert pad_batch(batch, 3)["ids"] is batch["ids"]
    with pytest.raises(ValueError):
        pad_batch(batch, 2)


def test_batch_length_rejects_disagreeing_tensors():
    with pytest.raises(ValueError, match="disagree"):
        batch_length({"a": np.zeros((2, 1)), "b": np.zeros((3, 1))})
    with pytest.raises(ValueError):
        batch_length({})


KEY_ARGS = dict(
    onnx_sha256="ab" * 32,
    gpu_name="NVIDIA H200",
    trt_version="10.8.0",
    profiles=parse_profiles(DEFAULT),
    precision="fp16",
)


def test_plan_cache_key_is_stable_and_sensitive_to_every_field():
    key = plan_cache_key(**KEY_ARGS)
    assert key == plan_cache_key(**KEY_ARGS)
    assert len(key) == 24
    changed = [
        {"onnx_sha256": "cd" * 32},
        {"gpu_name": "NVIDIA A100-SXM4-80GB"},
        {"trt_version": "10.9.0"},
        {"profiles": parse_profiles("1:1:1,2:4:8")},
        {"profiles": parse_profiles("2:4:8,1:1:1,8:16:32")},  # order = profile index
        {"precision": "fp32"},
    ]
    keys = {plan_cache_key(**{**KEY_ARGS, **c}) for c in changed}
    assert key not in keys
    assert len(keys) == len(changed)
    assert plan_cache_key(**KEY_ARGS, extra={"cc": "9.0"}) != key
    with pytest.raises(ValueError):
        plan_cache_key(**{**KEY_ARGS, "precision": "int8"})


def test_plan_file_name_and_file_hash(tmp_path):
    assert plan_file_name("mobilenet_v2", "k1") == "mobilenet_v2-k1.plan"
    assert plan_file_name("a/b c", "k") == "a_b_c-k.plan"
    f = tmp_path / "x.onnx"
    f.write_bytes(b"abc")
    assert file_sha256(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
