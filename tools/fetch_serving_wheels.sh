#!/usr/bin/env bash
# The server's dependencies (FastAPI, uvicorn with uvloop and httptools, prometheus_client, httpx
# and what they need) as wheels for the course's offline GPU machine (Python 3.12, x86_64), beside
# the Jupyter/nbval wheels that ../shared/gpu/fetch-wheels.sh puts in .whl/: chapters 16 and 17
# serve over HTTP there too.
#
#   bash tools/fetch_serving_wheels.sh [DIR]      (default: .whl)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
mkdir -p "$DIR"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$DIR" fastapi uvicorn uvloop httptools prometheus_client httpx
echo "$(ls "$DIR"/*.whl | wc -l) wheels in $DIR"
