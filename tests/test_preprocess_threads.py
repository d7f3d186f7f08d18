"""Image preprocessing runs torch ops without starting an OpenMP team of its own, so an image
upload does not make the engines' teams sleep between parallel regions
(server/http/preprocess_threads.py). Checked in a fresh interpreter: a thread count is only
meaningful in a process no other test has started threads in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import io, json, os
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np, torch
    from PIL import Image
    from wattserve.server.http.image_preprocess import preprocess_image
    from wattserve.server.http.preprocess_threads import preprocess_executor

    tasks = lambda: len(os.listdir("/proc/self/task"))
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(buf, "PNG")
    expected = preprocess_image(buf.getvalue(), "mobilenet_v2")  # main thread: its team exists now
    pool = preprocess_executor()
    report = {"cpus_torch": torch.get_num_threads()}
    before = tasks()
    got, pool_threads = pool.submit(lambda: (preprocess_image(buf.getvalue(), "mobilenet_v2"),
                                             torch.get_num_threads())).result()
    report["pool_added"] = tasks() - before
    report["pool_torch_threads"] = pool_threads
    report["same_tensor"] = bool(np.array_equal(got, expected))
    report["main_torch_threads_after"] = torch.get_num_threads()
    plain = ThreadPoolExecutor(1)
    before = tasks()
    plain.submit(preprocess_image, buf.getvalue(), "mobilenet_v2").result()
    report["plain_added"] = tasks() - before
    print(json.dumps(report))
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_preprocessing_threads_start_no_openmp_team():
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["same_tensor"], "same preprocessing result as on any other thread"
    assert report["pool_torch_threads"] == 1
    assert report["pool_added"] == 1, "only the pool's own thread: no OpenMP workers behind it"
    assert report["main_torch_threads_after"] == report["cpus_torch"], "other threads keep their count"
    if report["cpus_torch"] > 1:  # the control: a plain thread does start a team of its own
        assert report["plain_added"] == report["cpus_torch"], report
