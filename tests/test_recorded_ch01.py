"""Chapter 1: the sizes its prose states in words, checked against the code that glues them."""

import json
import re

from minipaged.runtime import results_path
from minipaged.sizing import kv_shape_from_config, parameter_count, reference_configs

GiB = 1 << 30


def test_llama_70b_sizes_the_prose_quotes():
    config = reference_configs()["Llama-3.1-70B"]
    shape = kv_shape_from_config(config)
    weights = parameter_count(config) * shape.dtype_bytes
    assert shape.bytes_per_token == 320 * 1024
    assert 8 * 8192 * shape.bytes_per_token == 20 * GiB            # "a modest add-on"
    batch = 32 * 32768 * shape.bytes_per_token
    assert batch == 320 * GiB and 2.4 < batch / weights < 2.5      # "2.4 times the weights"
    assert 141.0e9 < weights < 141.2e9                            # "141 GB" usually quoted
    assert 32 * 131072 * shape.bytes_per_token == 1280 * GiB      # the full 128K context


def test_weights_nearly_fill_one_h200():
    ledger = json.loads(results_path("gpu_status.json").read_text())
    device = ledger["chapters"]["01_kv_sizing"]["device"]
    h200 = int(re.search(r"(\d+) MiB", device).group(1)) * 2**20
    config = reference_configs()["Llama-3.1-70B"]
    weights = parameter_count(config) * 2
    assert 0.9 * h200 < weights < h200


def test_small_models_are_dominated_by_kv_early():
    config = reference_configs()["Qwen3-0.6B"]
    shape = kv_shape_from_config(config)
    crossover = parameter_count(config) * 2 / (8 * shape.bytes_per_token)
    assert crossover < 2048                                       # "almost at once"
