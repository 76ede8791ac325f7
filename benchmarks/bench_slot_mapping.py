"""Time the block manager's per-step work for a decode step of 256 running sequences.

    python benchmarks/bench_slot_mapping.py [--num-seqs 256] [--block-size 16] [--repeats 2000]

Prints one JSON object and writes it to results/slot_mapping_cpu.json. Measured per step, each
once, in this process: reserve_step (the step's new blocks and its slot mapping) + commit_step of
chapter 4's KVBlockManager; the step's slot mapping computed three ways (a Python formula per
token, compute_slot_mapping on table slices, a NumPy gather from the manager's table array) and
the same gather with chapter 3's ``slots_for_positions``; the slot mapping of a prefill-sized
step (8 x 1,024 tokens) by a Python formula, compute_slot_mapping and the gather; the batch's
block-table tensor built from the 256 table lists (the first version in chapter 4) and gathered
from the table array (``get_block_table_tensor``); and the same step on chapter 6's engine-facing
PrefixCachingBlockManager, including telling it each sequence's sampled token.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minipaged.memory.block_manager import KVBlockManager, compute_slot_mapping  # noqa: E402
from minipaged.memory.block_table import slots_for_positions  # noqa: E402
from minipaged.memory.prefix_cache import PrefixCachingBlockManager  # noqa: E402

TARGET_US = 500
PREFILL_SEQS, PREFILL_TOKENS = 8, 1024  # a prefill step of 8 prompts of 1,024 tokens


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def tensor_from_lists(manager: KVBlockManager, seq_ids: list) -> torch.Tensor:
    """The batch's block-table tensor built row by row from the tables (the first version
    of ``get_block_table_tensor`` in chapter 4)."""
    tables = [manager.block_table(s) for s in seq_ids]
    out = np.zeros((len(tables), max(map(len, tables), default=0)), dtype=np.int32)
    for row, table in enumerate(tables):
        out[row, :len(table)] = table
    return torch.from_numpy(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "results" / "slot_mapping_cpu.json"))
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    bs = args.block_size
    prompts = rng.integers(100, 2000, size=args.num_seqs)
    blocks = int(sum(-(-(p + args.repeats + 1) // bs) for p in prompts))
    manager = KVBlockManager(num_physical_blocks=blocks, block_size=bs)
    batch = list(range(args.num_seqs))
    for seq, prompt in zip(batch, prompts):
        manager.create_sequence(seq)
        manager.append_tokens(seq, int(prompt))

    step_s, map_s = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step = manager.reserve_step(batch)
        manager.commit_step(step)
        step_s.append(time.perf_counter() - start)
    assert manager.invariants_ok()

    table_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        manager.get_block_table_tensor(batch)
        table_s.append(time.perf_counter() - start)

    lists_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        tensor_from_lists(manager, batch)
        lists_s.append(time.perf_counter() - start)
    assert torch.equal(tensor_from_lists(manager, batch), manager.get_block_table_tensor(batch))

    tables = [manager.block_table(s) for s in batch]
    lengths = [manager.sequence_length(s) - 1 for s in batch]  # the last written token of each
    python_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        python_slots = torch.tensor([t[n // bs] * bs + n % bs for t, n in zip(tables, lengths)],
                                    dtype=torch.int64)
        python_s.append(time.perf_counter() - start)
    for _ in range(args.repeats):
        start = time.perf_counter()
        firsts = [t // bs for t in lengths]
        numpy_slots = compute_slot_mapping([t[f:f + 1] for t, f in zip(tables, firsts)], firsts,
                                           lengths, [1] * len(batch), bs)
        map_s.append(time.perf_counter() - start)
    assert python_slots.tolist() == numpy_slots.tolist()

    # The same decode slot mapping from the manager's table array: NumPy, then chapter 3's function.
    array = manager._seqs.mirror.array
    rows = manager._seqs.rows([manager._seqs[s] for s in batch])
    positions = np.asarray(lengths, dtype=np.int64)
    rows_t, positions_t = torch.from_numpy(rows), torch.from_numpy(positions)
    gather_s, ch3_s = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        numpy_slots = torch.from_numpy(array[rows, positions // bs].astype(np.int64) * bs + positions % bs)
        gather_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        ch3_slots = slots_for_positions(torch.from_numpy(array), positions_t, bs, rows=rows_t)
        ch3_s.append(time.perf_counter() - start)
    assert torch.equal(numpy_slots, ch3_slots) and torch.equal(numpy_slots, python_slots)

    # A prefill-sized step: the first PREFILL_TOKENS positions of PREFILL_SEQS sequences.
    pre = sorted(range(len(batch)), key=lambda i: -lengths[i])[:PREFILL_SEQS]
    n_pre = min([PREFILL_TOKENS] + [lengths[i] + 1 for i in pre])  # fewer only in tiny runs
    pre_rows = np.repeat(rows[pre], n_pre)
    pre_pos = np.tile(np.arange(n_pre, dtype=np.int64), len(pre))
    pre_python_s, pre_numpy_s, pre_gather_s = [], [], []
    for _ in range(max(args.repeats // 10, 1)):
        start = time.perf_counter()
        python_pre = torch.tensor([tables[i][t // bs] * bs + t % bs for i in pre
                                   for t in range(n_pre)], dtype=torch.int64)
        pre_python_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        blocks_pre = -(-n_pre // bs)
        numpy_pre = compute_slot_mapping([tables[i][:blocks_pre] for i in pre], [0] * len(pre),
                                         [0] * len(pre), [n_pre] * len(pre), bs)
        pre_numpy_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        gather_pre = torch.from_numpy(array[pre_rows, pre_pos // bs].astype(np.int64) * bs
                                      + pre_pos % bs)
        pre_gather_s.append(time.perf_counter() - start)
    assert python_pre.tolist() == numpy_pre.tolist() == gather_pre.tolist()

    prefix = PrefixCachingBlockManager(blocks, bs, event_log_size=0)
    for seq, prompt in zip(batch, prompts):
        computed = prefix.allocate_prompt(seq, rng.integers(0, 150_000, int(prompt)).tolist())
        prefix.commit_step(prefix.reserve_step({seq: int(prompt) - computed}))
    prefix_s = []
    for i in range(args.repeats):
        start = time.perf_counter()
        for seq in batch:
            prefix.append_token_ids(seq, [i])
        step = prefix.reserve_step(batch)
        prefix.commit_step(step)
        prefix_s.append(time.perf_counter() - start)
    assert prefix.invariants_ok()

    record = {
        "device": cpu_model(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "python": platform.python_version(),
        "num_seqs": args.num_seqs,
        "block_size": bs,
        "repeats": args.repeats,
        "step_us_median": statistics.median(step_s) * 1e6,
        "step_us_p90": float(np.percentile(step_s, 90) * 1e6),
        "slot_mapping_python_us_median": statistics.median(python_s) * 1e6,
        "slot_mapping_us_median": statistics.median(map_s) * 1e6,
        "mirror_gather_us_median": statistics.median(gather_s) * 1e6,
        "ch3_slots_for_positions_us_median": statistics.median(ch3_s) * 1e6,
        "prefill_tokens": len(pre) * n_pre,
        "prefill_slots_python_us_median": statistics.median(pre_python_s) * 1e6,
        "prefill_slots_numpy_us_median": statistics.median(pre_numpy_s) * 1e6,
        "prefill_slots_gather_us_median": statistics.median(pre_gather_s) * 1e6,
        "block_table_from_lists_us_median": statistics.median(lists_s) * 1e6,
        "block_table_tensor_us_median": statistics.median(table_s) * 1e6,
        "prefix_caching_step_us_median": statistics.median(prefix_s) * 1e6,
        "target_us": TARGET_US,
        "note": "step = reserve_step + commit_step of a one-token decode step for every sequence "
                "(KVBlockManager); slot_mapping_python, slot_mapping (compute_slot_mapping on "
                "table slices), mirror_gather and ch3_slots_for_positions = that step's slot "
                "mapping, the last two from the manager's table array; block_table_from_lists = "
                "the padded tensor built row by row from the 256 tables, block_table_tensor = "
                "get_block_table_tensor (one gather from the table array); prefill_slots_* = the "
                "slot mapping of 8 sequences x 1,024 tokens: a Python formula per token, "
                "compute_slot_mapping, the gather from the table array; "
                "prefix_caching_step adds append_token_ids per sequence and block "
                "registration (PrefixCachingBlockManager, event log off); the 2-core machine was "
                "shared with other jobs while this ran",
    }
    record["meets_target"] = record["step_us_median"] < TARGET_US
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
