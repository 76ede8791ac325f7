# GENERATED from chapters/17_openai_server.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/17_openai_server.md § A live view of the block pool
"""The dashboard: a snapshot of the block pool (taken on the engine loop's thread) and
one HTML page that draws it."""

from __future__ import annotations

import statistics

__all__ = ["block_pool_state", "recent_latencies", "DASHBOARD_HTML"]


def block_pool_state(engine_loop, metrics=None) -> dict:
    """Every physical block's state and holders, the queues and recent latencies.

    Call it where the engine lives, between two steps (``await engine_loop.call(
    block_pool_state)``, in the loop's thread or the core process): there the manager
    is consistent and nobody changes it. Plain lists and numbers: it crosses a pipe."""
    engine, metrics = engine_loop.engine, metrics or getattr(engine_loop, "metrics", None)
    manager, scheduler = engine.manager, engine.scheduler
    seqs = {s.seq_id: s for q in (scheduler.running, scheduler.waiting, scheduler.swapped)
            for s in q}

    def name(seq_id):
        seq = seqs.get(seq_id)
        return None if seq is None else str(seq.request_id)

    owners = manager.block_owners()
    states, refcounts, holders = [], [], {}
    for block in range(manager.num_physical_blocks):
        held = owners.get(block, [])
        count = manager.refcount(block) if hasattr(manager, "refcount") else len(held)
        cached = hasattr(manager, "is_cached") and manager.is_cached(block)
        states.append("shared" if count > 1 else "used" if held else
                      "cached" if cached else "free")
        refcounts.append(count)
        for seq_id in held:
            holders.setdefault(name(seq_id), []).append(block)
    queue = lambda q: list(dict.fromkeys(name(s.seq_id) for s in q))  # noqa: E731
    return {"block_size": manager.block_size, "num_blocks": manager.num_physical_blocks,
            "num_free_blocks": manager.num_free_blocks, "states": states,
            "refcounts": refcounts, "holders": holders,
            "running": queue(scheduler.running), "waiting": queue(scheduler.waiting),
            "swapped": queue(scheduler.swapped),
            **recent_latencies(metrics),
            "consistent": manager.first_inconsistency() is None}


def recent_latencies(metrics=None) -> dict:
    """The median TTFT and TPOT of the last requests, from the server's metrics."""
    ms = lambda xs: round(1000 * statistics.median(xs), 2) if xs else None  # noqa: E731
    return {"median_ttft_ms": ms(list(metrics.recent_ttft)) if metrics else None,
            "median_tpot_ms": ms(list(metrics.recent_tpot)) if metrics else None}


# %% chapters/17_openai_server.md § A live view of the block pool
DASHBOARD_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>minipaged: block pool</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
#pool{display:grid;grid-template-columns:repeat(auto-fill,14px);gap:2px;max-width:900px}
.b{width:14px;height:14px;border-radius:2px} .free{background:#e4e4e4}
.cached{background:#9ecae1} .used{background:#31a354} .shared{background:#e6550d}
.b.hl{outline:2px solid #000} td,th{padding:2px 10px;text-align:left}
.legend span{display:inline-block;margin-right:1em}
</style></head><body>
<h1>Block pool</h1>
<p id="summary">loading ...</p>
<p class="legend"><span><i class="b free" style="display:inline-block"></i> free</span>
<span><i class="b cached" style="display:inline-block"></i> cached, reusable</span>
<span><i class="b used" style="display:inline-block"></i> in use</span>
<span><i class="b shared" style="display:inline-block"></i> shared (refcount &gt; 1)</span></p>
<div id="pool"></div>
<h2>Requests</h2>
<table><thead><tr><th>request</th><th>queue</th><th>blocks</th></tr></thead>
<tbody id="requests"></tbody></table>
<script>
async function refresh() {
  let s;
  try { s = await (await fetch("dashboard/state")).json(); }
  catch (e) { document.getElementById("summary").textContent = "server unreachable"; return; }
  const count = k => s.states.filter(x => x === k).length;
  document.getElementById("summary").textContent =
    `${s.num_blocks} blocks of ${s.block_size} tokens: ${count("used")} in use, ` +
    `${count("shared")} shared, ${count("cached")} cached, ${count("free")} free | ` +
    `running ${s.running.length}, waiting ${s.waiting.length} | median TTFT ` +
    `${s.median_ttft_ms ?? "-"} ms, TPOT ${s.median_tpot_ms ?? "-"} ms` +
    (s.consistent ? "" : " | MANAGER INCONSISTENT");
  const pool = document.getElementById("pool");
  pool.replaceChildren(...s.states.map((state, i) => {
    const d = document.createElement("div");
    d.className = "b " + state; d.id = "block-" + i;
    d.title = `block ${i}: ${state}, refcount ${s.refcounts[i]}`;
    return d;
  }));
  const rows = document.getElementById("requests");
  const where = r => s.running.includes(r) ? "running" : s.waiting.includes(r) ? "waiting" : "swapped";
  rows.replaceChildren(...Object.entries(s.holders).map(([r, blocks]) => {
    const tr = document.createElement("tr");
    tr.innerHTML = `<td>${r}</td><td>${where(r)}</td><td>${blocks.join(" ")}</td>`;
    tr.onmouseenter = () => blocks.forEach(b => document.getElementById("block-" + b).classList.add("hl"));
    tr.onmouseleave = () => blocks.forEach(b => document.getElementById("block-" + b).classList.remove("hl"));
    return tr;
  }));
}
refresh(); setInterval(refresh, 500);
</script></body></html>
"""
"""The dashboard page: polls ``dashboard/state`` and draws every block."""
