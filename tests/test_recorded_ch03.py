"""Chapter 3: what the prose says about the recorded H200 block-size sweep of chapter 8."""

import json

from minipaged.runtime import results_path


def test_the_kernel_barely_depends_on_the_block_size():
    recorded = json.loads(results_path("decode_attention_h200.json").read_text())
    sweep = {r["shape"]["block_size"]: r["median_us"] for r in recorded["rows"]
             if r.get("sweep") == "block_size"}
    assert sorted(sweep) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert max(sweep.values()) / min(sweep.values()) < 1.05     # "hardly cares"
    small = [sweep[b] for b in (1, 2, 4, 8)]
    assert min(sweep.values()) < min(small)                     # the best is above 8
