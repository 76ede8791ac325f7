#!/usr/bin/env bash
# The GPU runner: every chapter under nbval on the GPU, every Triton kernel compiled for the readers'
# cards (sm75 T4, sm80 A100, sm89 L4), then the GPU benchmarks; logs and JSON in $OUT.
#
#   bash tools/gpu_run.sh [chapters] [compile] [bench]      (default: all three)
#   OUT=dir CHAPTERS="07 08" BENCHES="decode_attention" bash tools/gpu_run.sh
#
# On your own GPU machine: `make gpu-test` (it installs the dev extras into .venv and runs this script
# with PY=.venv/bin/python; run directly, PY defaults to python3).
# On the course's offline H200, the Jupyter/nbval wheels travel in .whl/ (fetched with
# ../shared/gpu/fetch-wheels.sh; the server wheels of chapters 16 and 17 with tools/fetch_serving_wheels.sh) and are
# installed into /tmp/site first.
# At most a handful of files come back from the H200, so logs are merged: gpu_run_<date>.json (per
# chapter: cells passed/failed, seconds, the chapter's sha256; the commit; the compile results),
# nbval.log, bench.log and one JSON per benchmark. Fold the run into the ledger of green GPU runs,
# results/gpu_status.json, with
#   python tools/gpu_status.py --record gpu-out/gpu_run_<date>.json
# (it updates the chapters of that run and keeps the others); `make gpu-status` then tells which
# chapters changed since their last green GPU run. The run's own JSON is not kept in results/.
# The run records the commit it was given as GIT_COMMIT, else the one git reports where it runs; a
# copy of the working tree sent to another machine may carry a stale git HEAD, so write the hash
# into the command where it is made, not where it runs:
#   GIT_COMMIT=<the hash git rev-parse HEAD prints here> CHAPTERS="15" bash tools/gpu_run.sh chapters
# (a chapter's sha256, not the commit, is what the ledger compares).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
STEPS=${*:-chapters compile bench}
CHAPTERS=${CHAPTERS:-}
BENCHES=${BENCHES:-decode_attention qwen3_decode engine policies swap_copy}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-240}
PY=${PY:-python3}

if ! $PY -c "import jupytext, nbval" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "wheel install failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  else
    echo "jupytext/nbval missing: pip install -e '.[dev]' first" >&2; exit 1
  fi
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1

steps_json=()
record() {  # name rc seconds
  steps_json+=("{\"step\": \"$1\", \"rc\": $2, \"seconds\": $3}")
}

device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "device: ${device:-none}"
$PY - <<'PY'
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())
PY

for step in $STEPS; do
  case $step in
    chapters)
      start=$(date +%s)
      $PY tools/run_chapters.py --jobs 1 --json "$OUT/.chapters.json" $CHAPTERS > "$OUT/nbval.log" 2>&1
      rc=$?
      record chapters $rc $(( $(date +%s) - start ))
      tail -5 "$OUT/nbval.log"
      ;;
    compile)
      start=$(date +%s)
      $PY tools/compile_targets.py --out "$OUT" >> "$OUT/nbval.log" 2>&1
      rc=$?
      record compile $rc $(( $(date +%s) - start ))
      echo "compile for sm75/sm80/sm89: exit $rc"
      ;;
    bench)
      : > "$OUT/bench.log"
      for name in $BENCHES; do
        script=benchmarks/bench_$name.py
        [ -f "$script" ] || { echo "skip $name: no $script" | tee -a "$OUT/bench.log"; continue; }
        start=$(date +%s)
        echo "== $script" >> "$OUT/bench.log"
        timeout "$BENCH_TIMEOUT" $PY "$script" --out "$OUT" >> "$OUT/bench.log" 2>&1
        rc=$?
        record "bench_$name" $rc $(( $(date +%s) - start ))
        echo "$script: exit $rc"
      done
      ;;
    *) echo "unknown step $step (chapters|compile|bench)" >&2; exit 2 ;;
  esac
done

STEPS_JSON="[$(IFS=,; echo "${steps_json[*]}")]" DEVICE="${device:-none}" COMMAND="bash tools/gpu_run.sh $STEPS" \
COMMIT="${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" OUT="$OUT" $PY - <<'PY'
import datetime, json, os
from pathlib import Path
out = Path(os.environ["OUT"])
now = datetime.datetime.now(datetime.timezone.utc)
record = {"device": os.environ["DEVICE"], "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
          "command": os.environ["COMMAND"], "commit": os.environ["COMMIT"],
          "steps": json.loads(os.environ["STEPS_JSON"])}
for key, name in (("chapters", ".chapters.json"), ("compile_targets", "compile_targets.json")):
    part = out / name
    if part.exists():
        record[key] = json.loads(part.read_text())
        part.unlink()
path = out / f"gpu_run_{now:%Y-%m-%d}.json"
path.write_text(json.dumps(record, indent=1) + "\n")
print(path.read_text())
print(f"fold it into the ledger: python tools/gpu_status.py --record {path}")
PY
! grep -q '"rc": [1-9]' "$OUT"/gpu_run_*.json
