"""Regression checks of the recorded numbers chapter 9 shows (results/qwen3_decode_h200.json).

The chapter glues these values into its prose; what the prose says about them (near-ties, the
tolerance's margin, a decode step that barely slows with four times the batch) is checked here,
so a re-recorded run that contradicts the text fails a test instead of silently changing it.
"""

import json

import pytest
import torch

from minipaged.qwen3 import (ATTENTION_TOLERANCE, LOGITS_TOLERANCE, Qwen3PagedModel,
                             qwen3_0_6b_config)
from minipaged.runtime import results_path

RUN = json.loads(results_path("qwen3_decode_h200.json").read_text())
PARITY = RUN["parity"]


def test_recorded_run_is_the_shape_the_chapter_names():
    config = RUN["config"]
    assert (config["layers"], config["hidden"], config["heads"], config["kv_heads"],
            config["head_dim"], config["vocab"]) == (28, 1024, 16, 8, 128, 151936)
    assert config["dtype"] == PARITY["dtype"] == "torch.bfloat16"
    assert not config["tied_embeddings"]


def test_layer_errors_start_at_one_rounding_and_stay_inside_the_tolerance():
    layers = PARITY["attention_layer_errors"]
    assert len(layers) == 28
    assert round(layers[0], 4) == 0.0045            # about one bf16 rounding, 2**-8
    assert layers[0] < 2 ** -7
    assert round(max(layers), 3) == 0.046
    assert max(layers[:5]) < min(layers[-10:])       # grows along the residual stream
    assert ATTENTION_TOLERANCE[torch.bfloat16] / max(layers) == pytest.approx(1.74, abs=0.01)


def test_logits_errors_and_divergences_at_near_ties():
    prompts = PARITY["prompts"]
    errors = [p["max_logits_error"] for p in prompts]
    assert (round(min(errors), 3), round(max(errors), 3)) == (0.052, 0.063)
    assert max(errors) < LOGITS_TOLERANCE[torch.bfloat16]
    assert [p["identical_tokens"] for p in prompts] == [8, 4, 24, 0, 16, 2]
    assert sum(p["identical_tokens"] == PARITY["new_tokens"] for p in prompts) == 1
    diverged = [p for p in prompts if p["identical_tokens"] < PARITY["new_tokens"]]
    assert all(p.get("near_tie") for p in diverged)
    gaps = [p["top2_gap_at_divergence"] for p in diverged]
    assert (round(min(gaps), 3), round(max(gaps), 3)) == (0.004, 0.016)
    assert max(gaps) < min(errors)                   # inside the rounding difference
    assert all(p["distinct_reference_tokens"] > 2 for p in prompts)   # not degenerate


def test_decode_speed_figures_the_prose_quotes():
    rows = RUN["rows"]
    rate = {(r["impl"].split()[0], r["batch"]): r["tokens_per_s"] for r in rows}
    step = {(r["impl"].split()[0], r["batch"]): r["decode_step_ms"] for r in rows}
    speedup = {b: rate["minipaged", b] / rate["transformers", b] for b in (16, 64)}
    assert (round(speedup[16], 2), round(speedup[64], 2)) == (1.53, 1.17)
    assert (round(step["minipaged", 16]), round(step["minipaged", 64])) == (70, 74)
    assert step["minipaged", 64] / step["minipaged", 16] < 1.1   # barely slows with 4x batch
    assert max(r["prefill_plus_one_token_s"] / r["seconds"] for r in rows) < 0.02


def test_weight_bytes_a_decode_step_reads():
    with torch.device("meta"):
        model = Qwen3PagedModel(qwen3_0_6b_config(
            tie_word_embeddings=RUN["config"]["tied_embeddings"]))
    read = 2 * sum(p.numel() for name, p in model.named_parameters()
                   if name != "embed_tokens.weight")
    assert round(read / 1e9, 2) == 1.19
    assert round(read / 4.29e12 * 1e3, 2) == 0.28


def test_cudnn_exclusion_figure():
    """The chapter quotes how much faster transformers' padded generate ran without cuDNN."""
    run = json.loads(results_path("engine_sdpa_backends_h200.json").read_text())
    by_path = {r["path"]: r for r in run["rows"]}
    ratio = (by_path["hf_generate_padded_no_cudnn"]["tok_per_s"]
             / by_path["hf_generate_padded"]["tok_per_s"])
    assert round(ratio, 1) == 3.4
    assert by_path["hf_generate_padded"]["requests"] == 64


def test_copy_bandwidth_the_roofline_uses():
    run = json.loads(results_path("decode_attention_h200.json").read_text())
    assert run["copy_bandwidth_tbps"] == pytest.approx(4.29)
    ridge = 1979e12 / 2 / (run["copy_bandwidth_tbps"] * 1e12)
    assert round(ridge) == 231
