#!/usr/bin/env bash
# Open the built book in headless Chromium and check what a reader sees: math rendered by MathJax,
# figures loaded, exercise and solution blocks present, the Colab button pointing at the .ipynb twin.
# Installs Debian's chromium (and CJK fonts, for the Chinese terms) and, from npm, playwright-core (no browser download) and mathjax@3, which
# is served in place of the CDN copy so the check works offline. Screenshots go to screenshots/.
# BOOK_PAGES=01_kv_sizing,03_block_tables checks only those pages.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f _build/html/index.html ] || { echo "build the book first: make book" >&2; exit 1; }
if ! command -v chromium >/dev/null; then
  echo "installing Debian's chromium ..."
  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-noto-cjk) >/dev/null \
    || { echo "could not install chromium (needs root and Debian's package registry)" >&2; exit 1; }
fi
TOOLS=${BROWSER_TOOLS_DIR:-$HOME/.cache/minipaged-browser}
if [ ! -d "$TOOLS/node_modules/playwright-core" ] || [ ! -d "$TOOLS/node_modules/mathjax" ]; then
  mkdir -p "$TOOLS"
  (cd "$TOOLS" && npm init -y >/dev/null && npm install -q --no-audit --no-fund playwright-core@1 mathjax@3 >/dev/null)
fi
PORT=${PORT:-8765}
python3 -m http.server "$PORT" --directory _build/html >/dev/null 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
sleep 1
mkdir -p screenshots
NODE_PATH="$TOOLS/node_modules" BOOK_DIR=_build/html BASE="http://127.0.0.1:$PORT" MATHJAX_DIR="$TOOLS/node_modules/mathjax" \
  node tools/browser_check.js
