#!/usr/bin/env bash
# A screenshot of a Colab twin as a reader sees it rendered: the notebook converted to HTML by
# nbconvert (its math typeset by MathJax 2, as in Jupyter), opened in headless Chromium.
#   bash tools/twin_screenshot.sh [notebooks/03_block_tables.ipynb] [_static/colab_twin_rendered.png]
# Installs what it lacks the way tools/browser_check.sh does: Debian's chromium, and from npm
# playwright-core (no browser download) and mathjax@2 (served locally: the check works offline);
# nbconvert into the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
TWIN=${1:-notebooks/03_block_tables.ipynb}
PNG=${2:-_static/colab_twin_rendered.png}
PY=${PY:-.venv/bin/python}
if ! command -v chromium >/dev/null; then
  echo "installing Debian's chromium ..."
  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-noto-cjk) >/dev/null \
    || { echo "could not install chromium (needs root and Debian's package registry)" >&2; exit 1; }
fi
"$PY" -c "import nbconvert" 2>/dev/null || "$PY" -m pip install -q nbconvert
TOOLS=${BROWSER_TOOLS_DIR:-$HOME/.cache/minipaged-browser}
if [ ! -d "$TOOLS/node_modules/playwright-core" ] || [ ! -d "$TOOLS/node_modules/mathjax2" ]; then
  mkdir -p "$TOOLS"
  (cd "$TOOLS" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install -q --no-audit --no-fund playwright-core@1 mathjax2@npm:mathjax@2 >/dev/null)
fi
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"; [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null || true' EXIT
ln -s "$TOOLS/node_modules/mathjax2" "$SITE/mathjax"
"$PY" -m jupyter nbconvert --to html --output-dir "$SITE" --output twin \
  --HTMLExporter.mathjax_url="mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe" "$TWIN" 2>/dev/null
PORT=${PORT:-8766}
python3 -m http.server "$PORT" --directory "$SITE" >/dev/null 2>&1 &
SERVER=$!
sleep 1
NODE_PATH="$TOOLS/node_modules" URL="http://127.0.0.1:$PORT/twin.html" PNG="$PNG" node - <<'JS'
const { chromium } = require("playwright-core");
(async () => {
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"] });
  const page = await browser.newPage({ viewport: { width: 1000, height: 1600 } });
  await page.route(/^https?:\/\/(?!127\.0\.0\.1)/, (route) => route.abort());  // offline
  await page.goto(process.env.URL, { waitUntil: "load" });
  await page.waitForFunction(() => window.MathJax && MathJax.Hub && MathJax.Hub.queue
    && MathJax.Hub.queue.pending === 0 && document.querySelector(".MathJax, .MathJax_CHTML"),
    null, { timeout: 30000 }).catch(() => console.error("MathJax did not finish; shot anyway"));
  await page.screenshot({ path: process.env.PNG, fullPage: false });
  await browser.close();
  console.log(`screenshot of the rendered twin: ${process.env.PNG}`);
})();
JS
