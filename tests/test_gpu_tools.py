"""The GPU runner's records: per-chapter results from nbval's JUnit report, and `make gpu-status`."""

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import gpu_status  # noqa: E402
import run_chapters  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="01_a.ipynb" name="Cell 0" time="1.5" />
<testcase classname="01_a.ipynb" name="Cell 1" time="0.5"><failure message="boom"/></testcase>
<testcase classname="02_b.ipynb" name="Cell 0" time="2.0" />
</testsuite></testsuites>"""


def test_per_chapter_counts_cells_and_hashes_the_chapter(tmp_path):
    a, b = tmp_path / "01_a.md", tmp_path / "02_b.md"
    a.write_text("a"), b.write_text("b")
    (tmp_path / "junit.xml").write_text(JUNIT)
    results = run_chapters.per_chapter([a, b], tmp_path / "junit.xml", real_model=True)
    assert results["01_a"] == {"passed": 1, "failed": 1, "skipped": 0, "seconds": 2.0,
                               "ok": False, "sha256": hashlib.sha256(b"a").hexdigest()}
    assert results["02_b"]["ok"] and results["02_b"]["passed"] == 1


def test_a_page_without_code_cells_is_ok_with_nothing_run_but_a_chapter_is_not(tmp_path):
    prose, code = tmp_path / "93_prose.md", tmp_path / "04_code.md"
    prose.write_text("# Only prose\n")
    code.write_text("# Code\n\n```{code-cell} ipython3\n1\n```\n")
    (tmp_path / "junit.xml").write_text("<testsuites><testsuite></testsuite></testsuites>")
    results = run_chapters.per_chapter([prose, code], tmp_path / "junit.xml", real_model=True)
    assert results["93_prose"]["ok"] and results["93_prose"]["passed"] == 0
    assert not results["04_code"]["ok"]  # a chapter whose cells never ran is not green


REAL_MODEL_CHAPTER = """# Real

```{code-cell} ipython3
x = 1
```

```{code-cell} ipython3
if real_model_available():
    print("Paris")
else:
    print(f"skipped: the real model {REAL_MODEL_ID} is not installed")
```
"""


def test_a_cell_that_needs_the_real_model_is_skipped_where_it_is_missing(tmp_path):
    chapter = tmp_path / "09_real.md"
    chapter.write_text(REAL_MODEL_CHAPTER)
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="09_real.ipynb" name="Cell 0" time="1"/>'
        '<testcase classname="09_real.ipynb" name="Cell 1" time="1"/></testsuite></testsuites>')
    without = run_chapters.per_chapter([chapter], tmp_path / "junit.xml", real_model=False)
    assert (without["09_real"]["passed"], without["09_real"]["skipped"]) == (1, 1)
    assert without["09_real"]["ok"]
    present = run_chapters.per_chapter([chapter], tmp_path / "junit.xml", real_model=True)
    assert (present["09_real"]["passed"], present["09_real"]["skipped"]) == (2, 0)
    ledger = gpu_status.new_ledger()
    gpu_status.fold(ledger, gpu_run("2026-01-01T00:00:00Z", without), "r.json")
    assert gpu_status.status(chapter, ledger) == (
        True, "green on GPU 2026-01-01 (1 cells, 1 skipped: no real model there)")


def gpu_run(date, chapters, **extra):
    """A run as tools/gpu_run.sh writes it (gpu_run_<date>.json)."""
    return {"device": "GPU", "date": date, "command": "bash tools/gpu_run.sh chapters",
            "commit": "abc1234", "chapters": chapters, **extra}


def test_gpu_status_says_green_changed_failed_or_unknown(tmp_path):
    chapter = tmp_path / "01_a.md"
    chapter.write_text("version 1")
    old = hashlib.sha256(b"version 1").hexdigest()
    ledger = gpu_status.new_ledger()
    assert gpu_status.status(chapter, ledger) == (False, "no per-chapter GPU record yet")
    gpu_status.fold(ledger, gpu_run("2026-01-01T00:00:00Z", {
        "01_a": {"ok": True, "passed": 3, "failed": 0, "seconds": 1.0, "sha256": old}}), "r1.json")
    assert gpu_status.status(chapter, ledger) == (True, "green on GPU 2026-01-01 (3 cells)")
    chapter.write_text("version 2")
    green, line = gpu_status.status(chapter, ledger)
    assert not green and line.startswith("CHANGED since its last green GPU run (2026-01-01)")
    new = hashlib.sha256(b"version 2").hexdigest()
    gpu_status.fold(ledger, gpu_run("2026-01-02T00:00:00Z", {
        "01_a": {"ok": False, "passed": 2, "failed": 1, "sha256": new}}), "r2.json")
    green, line = gpu_status.status(chapter, ledger)
    assert not green and line.startswith("FAILED 1 cell(s)")
    assert ledger["chapters"]["01_a"]["sha256"] == old       # the green run is kept beside it
    gpu_status.fold(ledger, gpu_run("2026-01-03T00:00:00Z", {
        "01_a": {"ok": True, "passed": 3, "failed": 0, "sha256": new}}), "r3.json")
    assert gpu_status.status(chapter, ledger)[0] and ledger["failures"] == {}


def test_recording_a_run_updates_its_chapters_and_keeps_the_others(tmp_path):
    """`gpu_status.py --record RUN.json`: the ledger keeps each chapter's latest green run."""
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    digest = {}
    for stem in ("01_a", "02_b"):
        (chapters / f"{stem}.md").write_text(stem)
        digest[stem] = hashlib.sha256(stem.encode()).hexdigest()
    ledger_path = tmp_path / "gpu_status.json"
    first = tmp_path / "gpu_run_2026-01-01.json"
    first.write_text(json.dumps(gpu_run("2026-01-01T00:00:00Z", {
        s: {"ok": True, "passed": 1, "failed": 0, "seconds": 2.0, "sha256": digest[s]}
        for s in digest}, compile_targets={"triton": "3.6.0", "kernels": {
            "m._k": {"specializations": 1, "sm75": "ok", "sm80": "ok", "sm89": "ok"}}})))
    second = tmp_path / "gpu_run_2026-01-02.json"
    second.write_text(json.dumps(gpu_run("2026-01-02T00:00:00Z", {
        "02_b": {"ok": True, "passed": 5, "failed": 0, "seconds": 3.0, "sha256": digest["02_b"]}},
        commit="def5678")))
    args = ["--ledger", str(ledger_path), "--chapters", str(chapters), "--strict"]
    assert gpu_status.main(args + ["--record", str(first)]) == 0
    assert gpu_status.main(args + ["--record", str(second)]) == 0
    ledger = json.loads(ledger_path.read_text())
    a, b = ledger["chapters"]["01_a"], ledger["chapters"]["02_b"]
    assert (a["run"], a["commit"], a["passed"]) == ("gpu_run_2026-01-01.json", "abc1234", 1)
    assert (b["run"], b["commit"], b["passed"]) == ("gpu_run_2026-01-02.json", "def5678", 5)
    assert {"device", "date", "command", "seconds", "sha256"} <= a.keys()
    assert ledger["compile_targets"]["kernels"]["m._k"]["sm75"] == "ok"
    assert ledger["compile_targets"]["run"] == "gpu_run_2026-01-01.json"
    assert gpu_status.main(args + ["--record", str(first)]) == 0   # an older run changes nothing
    assert json.loads(ledger_path.read_text())["chapters"]["02_b"] == b
    (chapters / "01_a.md").write_text("edited")
    assert gpu_status.main(args) == 1


def test_every_entry_of_the_recorded_ledger_is_a_green_run_with_its_provenance():
    ledger = gpu_status.load_ledger()
    assert ledger["chapters"]
    chapters = Path(__file__).resolve().parent.parent / "chapters"
    for name, entry in ledger["chapters"].items():
        assert {"device", "date", "command", "commit", "passed", "failed", "sha256"} <= entry.keys()
        has_code = "```{code-cell}" in (chapters / f"{name}.md").read_text()
        assert entry["failed"] == 0 and (entry["passed"] > 0 or not has_code), name


def test_compile_targets_without_a_gpu_says_so_and_compiles_nothing():
    import subprocess

    import torch

    if torch.cuda.is_available():
        return  # on a GPU the runner's `compile` step runs it for real
    script = Path(__file__).resolve().parent.parent / "tools" / "compile_targets.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "no CUDA GPU here" in done.stdout


def test_compile_targets_finds_every_kernel_and_its_inlined_helpers():
    import subprocess

    code = ("import sys; sys.path[:0] = ['tools', '.']\n"
            "import compile_targets as ct\n"
            "k = ct.find_kernels(); print(sorted(k)); print(ct.inlined_helpers(k))\n")
    env = {**__import__("os").environ, "TRITON_INTERPRET": "0"}  # real JITFunctions, no launch
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parent.parent, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    kernels, helpers = done.stdout.strip().splitlines()[-2:]
    for name in ("kernels.kv_cache._write_kv_kernel", "kernels.decode_attention._paged_decode_kernel"):
        assert name in kernels
    assert "kernels.decode_attention._attend_tiles" in helpers  # compiled inside its callers


def test_compile_targets_skips_e4m3_specializations_before_sm89():
    """A kernel that serves both caches (chapter 15's prefill) is compiled for every card
    with bf16 K/V, and for sm89 only with chapter 13's e4m3 K/V: compiled here, no GPU."""
    import subprocess

    code = """
import sys; sys.path[:0] = ['tools', '.']
import json, triton, compile_targets as ct
from triton.compiler import ASTSource
kernel = ct.find_kernels()["kernels.prefill_attention._paged_prefill_kernel"]
def spec(kv, scale):
    ptrs = {'q_ptr': '*bf16', 'k_ptr': kv, 'v_ptr': kv, 'out_ptr': '*bf16', 'ks_ptr': scale,
            'vs_ptr': scale}
    consts = dict(HEAD_DIM=64, DIM_PAD=64, BLOCK_SIZE=16, BLOCK_M=16, BLOCK_N=16,
                  FP32_PRECISION=None, FP8=kv != '*bf16')
    sig = {n: ptrs.get(n, 'constexpr' if n in consts else 'fp32' if n == 'scale_log2'
                       else '*i32' if n.endswith('_ptr') else 'i32') for n in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(n),): v for n, v in consts.items()})
    return src, {'num_warps': 4}
ct.REAL_COMPILE = triton.compile
both = dict(enumerate([spec('*bf16', '*bf16'), spec('*fp8e4nv', '*fp32')]))
report = ct.compile_for_targets({'bf16_and_fp8': both, 'fp8_only': {0: both[1]}}, {})
print(json.dumps(report))
"""
    env = {**__import__("os").environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parent.parent, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["bf16_and_fp8"] == {"specializations": 2, "sm75": "ok", "sm80": "ok",
                                      "sm89": "ok"}
    assert report["fp8_only"]["sm89"] == "ok"
    assert report["fp8_only"]["sm75"].startswith("n/a") and report["fp8_only"]["sm80"] == \
        report["fp8_only"]["sm75"]


def test_kernel_sass_reads_the_sm90_build_of_the_fp8_decode_kernel_without_a_gpu():
    """tools/kernel_sass.py compiles chapter 13's kernel for sm90 here and finds its tile loop:
    tensor-core products (HMMA) and the e4m3 conversions (F2FP) inside it."""
    import subprocess

    done = subprocess.run([sys.executable, "tools/kernel_sass.py", "fp8", "--tile", "64"],
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["target"] == "sm90" and 0 < report["registers"] <= 255
    assert report["shared_bytes"] > 0
    occupancy = report["programs_per_sm"]
    assert occupancy["programs"] >= 1 and occupancy["limited_by"]
    loop = report["loop"]
    assert loop["instructions"] > 100
    assert {"HMMA", "F2FP"} <= set(loop["top_opcodes"])


def test_kernel_sass_builds_the_table_ahead_candidate_for_sm90():
    """The candidate of benchmarks/archive/experiment_fp8_table_ahead.py compiles (not interpreted) for
    sm90, with the register cap of its default launch honoured."""
    import subprocess

    done = subprocess.run([sys.executable, "tools/kernel_sass.py", "fp8-table-ahead"],
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["tile"] == 128 and report["registers"] <= 128
    assert {"HMMA", "F2FP"} <= set(report["loop"]["top_opcodes"])
