"""Chapter 17's /dashboard rendered by headless Chromium while a server streams requests that share
a prefix: the page's script draws one cell per block, with blocks in use and shared, and a row per
request that holds blocks (skipped where no chromium is installed)."""

import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
if not (shutil.which("chromium") or shutil.which("chromium-browser")):
    pytest.skip("no chromium on this machine", allow_module_level=True)

from dashboard_snapshot import snapshot  # noqa: E402


def test_the_dashboard_renders_the_pool_under_load(tmp_path):
    dom = tmp_path / "dashboard.html"
    snapshot(None, dom)
    page = dom.read_text()
    states = re.findall(r'class="b (free|cached|used|shared)(?: hl)?" id="block-(\d+)"', page)
    assert sorted(int(i) for _, i in states) == list(range(256))  # one cell per block
    kinds = {s for s, _ in states}
    assert {"used", "shared"} <= kinds, kinds  # requests hold blocks; the prefix is shared
    summary = re.search(r'id="summary">([^<]*)', page).group(1)
    assert summary.startswith("256 blocks of 4 tokens") and "INCONSISTENT" not in summary
    assert re.search(r"running [1-8],", summary), summary
    assert page.count("<td>running</td>") >= 1
