"""tools/browser_check.js on a one-page book: a wide equation and a literal backslash in math fail
the check, their rewritten forms pass. Needs Debian's chromium and the npm packages that
tools/browser_check.sh installs; skipped without them."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(os.environ.get("BROWSER_TOOLS_DIR", Path.home() / ".cache/minipaged-browser"))
WIDE = r"""$$
o_{b,h} = \sum_{t < L_b} \operatorname{softmax}_t\!\left(\frac{q_{b,h} \cdot k_{b,g,t}}{\sqrt{D}}\right) v_{b,g,t},
\qquad k_{b,g,t} = K\big[\text{block\_tables}[b, \lfloor t/B \rfloor],\ t \bmod B,\ g\big].
$$"""
FITS = r"""$$
\begin{aligned}
o_{b,h} &= \sum_{t < L_b} \operatorname{softmax}_t\!\left(\frac{q_{b,h} \cdot k_{b,g,t}}{\sqrt{D}}\right) v_{b,g,t}, \\
k_{b,g,t} &= K\big[\mathtt{block\_tables}[b, \lfloor t/B \rfloor],\ t \bmod B,\ g\big].
\end{aligned}
$$"""

pytestmark = pytest.mark.skipif(
    not (Path("/usr/bin/chromium").exists() and (TOOLS / "node_modules/playwright-core").exists()
         and (TOOLS / "node_modules/mathjax").exists() and shutil.which("node")),
    reason="needs chromium, node, playwright-core and mathjax (see tools/browser_check.sh)")


def check_page(tmp_path: Path, math: str) -> subprocess.CompletedProcess:
    book = tmp_path / "book"
    (book / "chapters").mkdir(parents=True)
    for name in ("_ext", "_static"):
        shutil.copytree(ROOT / name, book / name)
    config = (ROOT / "_config.yml").read_text().replace("execute_notebooks: cache",
                                                        "execute_notebooks: off")
    (book / "_config.yml").write_text(config)
    (book / "references.bib").write_text("")
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n"
                                   "  - file: chapters/00_scratch\n")
    (book / "intro.md").write_text("# Scratch\n\nA page to check.\n")
    (book / "chapters/00_scratch.md").write_text(f"# 0. Scratch\n\nAttention reads:\n\n{math}\n")
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    built = subprocess.run([str(jupyter_book), "build", str(book)], capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    with socket.socket() as probe:  # a free port, so tests may run side by side
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory",
                               str(book / "_build/html")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    time.sleep(1)
    try:
        env = dict(os.environ, NODE_PATH=str(TOOLS / "node_modules"), BOOK_DIR=str(book / "_build/html"),
                   BASE=f"http://127.0.0.1:{port}", MATHJAX_DIR=str(TOOLS / "node_modules/mathjax"),
                   BOOK_PAGES="00_scratch")
        return subprocess.run(["node", str(ROOT / "tools/browser_check.js")], cwd=book, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        server.terminate()
        server.wait()


def test_a_wide_equation_and_a_literal_backslash_fail(tmp_path):
    seen = check_page(tmp_path, WIDE)
    assert seen.returncode == 1, seen.stdout + seen.stderr
    assert "wider than the column: mjx-container" in seen.stdout
    assert "literal backslash in math" in seen.stdout


def test_their_rewritten_forms_pass(tmp_path):
    seen = check_page(tmp_path, FITS)
    assert seen.returncode == 0, seen.stdout + seen.stderr
