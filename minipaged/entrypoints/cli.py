# GENERATED from chapters/17_openai_server.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/17_openai_server.md § minipaged serve
"""``minipaged serve MODEL``: the OpenAI-compatible server on the command line."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import multiprocessing
import os
import signal
import sys
from pathlib import Path

__all__ = ["build_parser", "model_from_args", "load_tokenizer", "build_engine",
           "serve_front_end", "main"]

SERVE_PACKAGES = ("fastapi", "uvicorn", "prometheus_client")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minipaged")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over OpenAI's HTTP API")
    serve.add_argument("model", help="hub id or folder of a Qwen3 model, or random:tiny / "
                       "random:qwen3-0.6b")
    add = serve.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8000)
    add("--api-key", default=None, help="require Authorization: Bearer KEY on /v1")
    add("--served-model-name", default=None)
    add("--tokenizer", default=None, help="tokenizer folder, hub id or .gguf file")
    add("--block-size", type=int, default=16)
    add("--max-num-seqs", type=int, default=256)
    add("--max-num-batched-tokens", type=int, default=8192)
    add("--max-model-len", type=int, default=None)
    add("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    add("--gpu-memory-utilization", type=float, default=0.9)
    add("--num-gpu-blocks-override", type=int, default=None, dest="num_blocks")
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    add("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    add("--max-waiting", type=int, default=256, help="waiting requests before 503")
    add("--api-server-count", type=int, default=1,
        help="processes serving HTTP on the port, sharing one engine core")
    add("--seed", type=int, default=0, help="weights of a random: model")
    return parser


def load_tokenizer(name: str | None):
    if name is None:
        return None
    from transformers import AutoTokenizer
    path = Path(name)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoTokenizer.from_pretrained(name)


# %% chapters/17_openai_server.md § minipaged serve
def _load_dtype(name: str, device):
    """The dtype to build or load the model in: the device's own for ``auto``, else full
    precision, which ``LLM(dtype=name)`` then casts to the dtype asked for."""
    import torch
    if name != "auto" or device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def model_from_args(args, tokenizer):
    """``(model, tokenizer)`` for ``args.model``: a random model, or any name or path
    chapter 9's ``load_model`` takes (the packaged SmolLM2 offline, a .gguf file, a
    transformers folder, a hub id)."""
    from minipaged.runtime import default_device
    device = default_device()
    dtype = _load_dtype(args.dtype, device)
    if args.model.startswith("random:"):
        from minipaged.model.qwen3 import qwen3_0_6b_config, random_qwen3, tiny_qwen3_config
        shapes = {"tiny": tiny_qwen3_config, "qwen3-0.6b": qwen3_0_6b_config}
        shape = args.model.split(":", 1)[1]
        if shape not in shapes:
            raise SystemExit(f"unknown random model {shape!r}: one of {sorted(shapes)}")
        extra = {"vocab_size": len(tokenizer)} if tokenizer is not None else {}
        if shape == "qwen3-0.6b":
            extra.update(tie_word_embeddings=False, initializer_range=0.2)
        return random_qwen3(shapes[shape](**extra), seed=args.seed, dtype=dtype,
                            device=device), tokenizer
    from minipaged.model.qwen3 import load_model
    model, own = load_model(args.model, dtype=dtype, device=device)
    return model, tokenizer or own


def build_engine(args):
    """The engine ``args`` describe; the engine core process calls it, so that the model
    and its cache live there only."""
    from minipaged.entrypoints.llm import LLM
    model, tokenizer = model_from_args(args, load_tokenizer(args.tokenizer))
    return LLM(model, tokenizer=tokenizer, dtype=args.dtype, block_size=args.block_size,
               num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens,
               max_model_len=args.max_model_len, kv_cache_dtype=args.kv_cache_dtype,
               gpu_memory_utilization=args.gpu_memory_utilization,
               enable_prefix_caching=args.enable_prefix_caching)


# %% chapters/17_openai_server.md § minipaged serve
def serve_front_end(args, core, sock, others: list = ()) -> None:
    """One server process (a front end): the app on ``core`` under uvicorn, accepting on
    the shared socket ``sock``. ``others``: the other front ends' processes, told to stop
    when this one is (a SIGTERM reaches only the process it is sent to)."""
    import uvicorn
    from minipaged.entrypoints.openai_server import create_app
    app = create_app(core, model_name=args.served_model_name or args.model, api_key=args.api_key,
                     max_waiting=args.max_waiting)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    exit_uvicorn = server.handle_exit

    def handle_exit(sig, frame):  # end the open streams first, then stop uvicorn
        core.stop(timeout=0)
        for other in others:
            if sig == signal.SIGTERM and other.is_alive():
                os.kill(other.pid, signal.SIGTERM)
        exit_uvicorn(sig, frame)

    server.handle_exit = handle_exit
    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn raises the signal again on exit:
        signal.signal(sig, lambda *_: None)      # once it has shut down, that is a clean exit
    server.run(sockets=[sock])


def _front_end_process(args, sock, channel) -> None:
    """The entry point of a front end beyond the first: it attaches to the running core."""
    from minipaged.entrypoints.core_client import EngineCoreClient
    core = EngineCoreClient(channel=channel, max_waiting=args.max_waiting)
    serve_front_end(args, core, sock)


# %% chapters/17_openai_server.md § minipaged serve
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = [p for p in SERVE_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        print(f"minipaged serve needs {', '.join(missing)}: pip install "
              + " ".join(p.replace("_", "-") for p in missing), file=sys.stderr)
        return 1
    if args.api_server_count < 1:
        print("--api-server-count must be at least 1", file=sys.stderr)
        return 2
    import uvicorn
    from minipaged.entrypoints.core_client import EngineCoreClient
    from minipaged.entrypoints.metrics import ServerMetrics
    name = args.served_model_name or args.model
    config = uvicorn.Config(None, host=args.host, port=args.port, log_level="warning")
    sock = config.bind_socket()  # bound once, here; every front end accepts on it
    core = EngineCoreClient(build=functools.partial(build_engine, args),
                            metrics=functools.partial(ServerMetrics, name),
                            max_waiting=args.max_waiting).start(args.api_server_count)
    spawn = multiprocessing.get_context("spawn")
    others = [spawn.Process(target=_front_end_process, args=(args, sock, channel),
                            name=f"minipaged-api-server-{i + 1}", daemon=True)
              for i, channel in enumerate(core.spare_channels)]
    for other in others:
        other.start()
    for end in (end for channel in core.spare_channels for end in channel):
        end.close()  # theirs now: the core must see a front end that dies hang up
    print(f"minipaged: serving {name!r} on http://{args.host}:{args.port}/v1 "
          f"(dashboard: http://{args.host}:{args.port}/dashboard)"
          + (f" with {args.api_server_count} API server processes" if others else ""),
          flush=True)
    serve_front_end(args, core, sock, others)
    for other in others:
        other.join(30)
        if other.is_alive():
            other.kill()
    return 0
