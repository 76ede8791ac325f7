# GENERATED from chapters/90_performance_notes.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/90_performance_notes.md § Chapter 2's simulator on a real trace
"""Chapter 2's simulator on a real trace: a CSV reader with loose column names, and a
command line (the performance notes)::

    python -m minipaged.book.trace --workload sharegpt --policy paged --block-size 16
    python -m minipaged.book.trace --trace requests.csv --policy max --budget-tokens 16384
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

from minipaged.book.fragmentation import (POLICIES, WORKLOADS, TraceRequest,
                                          generate_workload, poisson_arrivals, simulate)

__all__ = ["TraceFormatError", "read_trace_csv"]


# %% chapters/90_performance_notes.md § Chapter 2's simulator on a real trace
class TraceFormatError(ValueError):
    """A trace file that cannot be read as requests (missing column, bad value)."""


PROMPT_COLUMNS = ("prompt_len", "prompt_tokens", "prompt_length", "num_prompt_tokens",
                  "input_len", "input_tokens", "input_length", "num_input_tokens",
                  "context_tokens", "prompt", "input")
OUTPUT_COLUMNS = ("output_len", "output_tokens", "output_length", "num_output_tokens",
                  "completion_tokens", "generated_tokens", "response_tokens",
                  "response_len", "output", "completion")
ARRIVAL_COLUMNS = ("arrival", "arrival_step", "arrival_time")


def _normalise(column: str) -> str:
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", column.strip()).lower()
    return re.sub(r"[^a-z0-9]+", "_", snake).strip("_")


def _find_column(header: list[str], wanted: str | None, aliases: tuple[str, ...],
                 what: str, path: Path, required: bool = True) -> str | None:
    names = {_normalise(h): h for h in header}
    if wanted is not None:
        if wanted in header:
            return wanted
        if _normalise(wanted) in names:
            return names[_normalise(wanted)]
        raise TraceFormatError(f"{path}: no column {wanted!r}; the file has {header}")
    for alias in aliases:
        if alias in names:
            return names[alias]
    if required:
        raise TraceFormatError(
            f"{path}: found no {what} column among {header}; name one of "
            f"{list(aliases)} or pass it explicitly ({what}_column=NAME, or "
            f"--{what}-column NAME on the command line)")
    return None


# %% chapters/90_performance_notes.md § Chapter 2's simulator on a real trace
def read_trace_csv(path: str | Path, *, prompt_column: str | None = None,
                   output_column: str | None = None, arrival_column: str | None = None,
                   rate: float | None = 1.0, seed: int = 0) -> list[TraceRequest]:
    """Read requests from a CSV with prompt- and output-token columns (loose names).

    An arrival column (in decode steps) is used if present; otherwise arrivals are
    Poisson at ``rate`` requests per step, drawn with ``seed``. Raises
    ``TraceFormatError`` on a missing column or a value that is not a non-negative whole
    number (prompts need one token).
    """
    path = Path(path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        if not header:
            raise TraceFormatError(f"{path}: empty file, expected a header row")
        p_col = _find_column(header, prompt_column, PROMPT_COLUMNS, "prompt", path)
        o_col = _find_column(header, output_column, OUTPUT_COLUMNS, "output", path)
        a_col = _find_column(header, arrival_column, ARRIVAL_COLUMNS, "arrival", path,
                             required=False)
        rows = list(reader)
    requests = []
    arrivals = poisson_arrivals(np.random.default_rng(seed), len(rows), rate)
    for line, (row, arrival) in enumerate(zip(rows, arrivals), start=2):
        try:
            prompt, output = float(row[p_col]), float(row[o_col])
            arrival = float(row[a_col]) if a_col else float(arrival)
        except (TypeError, ValueError):
            raise TraceFormatError(
                f"{path}, line {line}: expected numbers in {p_col!r} and {o_col!r}, "
                f"got {row.get(p_col)!r} and {row.get(o_col)!r}")
        if prompt < 1 or output < 0 or prompt != int(prompt) or output != int(output):
            raise TraceFormatError(
                f"{path}, line {line}: token counts must be whole numbers, prompt >= 1 "
                f"and output >= 0; got {prompt}, {output}")
        requests.append(TraceRequest(arrival, int(prompt), int(output)))
    return requests


# %% chapters/90_performance_notes.md § Chapter 2's simulator on a real trace
def main(argv: list[str] | None = None) -> int:
    """Command line: simulate one policy on a trace or a generated workload (JSON)."""
    parser = argparse.ArgumentParser(
        prog="python -m minipaged.book.trace",
        description="Where KV memory goes under one allocation policy (JSON).")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", type=Path,
                        help="CSV with prompt- and output-token columns")
    source.add_argument("--workload", choices=sorted(WORKLOADS), default="sharegpt")
    parser.add_argument("--policy", choices=POLICIES, default="paged")
    parser.add_argument("--budget-tokens", type=int, default=16384)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=1.0,
                        help="arrivals per decode step")
    parser.add_argument("--prompt-column", help="the prompt-token column of --trace")
    parser.add_argument("--output-column", help="the output-token column of --trace")
    args = parser.parse_args(argv)
    try:
        if args.trace is not None:
            requests = read_trace_csv(args.trace, prompt_column=args.prompt_column,
                                      output_column=args.output_column, rate=args.rate,
                                      seed=args.seed)
        else:
            requests = generate_workload(args.workload, args.num_requests, args.seed,
                                         rate=args.rate, max_len=args.max_len)
        result = simulate(requests, args.policy, args.budget_tokens,
                          block_size=args.block_size, max_len=args.max_len)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    summary = result.summary()
    summary["source"] = (str(args.trace) if args.trace
                         else f"{args.workload} seed {args.seed}")
    print(json.dumps(summary))
    return 0


# run as a script, not in a notebook
if __name__ == "__main__" and "__file__" in globals():
    sys.exit(main())
