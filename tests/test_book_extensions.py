"""The book's own Sphinx extensions (_ext/): results in the cache key, per-chapter figure numbers,
repository links, the .ipynb download."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import jupytext
import yaml
from jupyter_cache.cache.main import JupyterCacheBase

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "_ext"))
import chapter_numbers  # noqa: E402
import colab_button  # noqa: E402
import repository_links  # noqa: E402
import results_inputs  # noqa: E402

CHAPTER = """\
---
kernelspec: {display_name: Python 3, language: python, name: python3}
---

# A chapter

```{code-cell} ipython3
data = json.loads(results_path("run_h200.json").read_text())
```
"""


def cache_key(text: str) -> str:
    notebook = jupytext.reads(text, fmt="myst")
    return JupyterCacheBase.create_hashed_notebook(None, notebook)[1]


def read_as_sphinx_does(text: str, srcdir: Path) -> str:
    source = [text]
    results_inputs.stamp(SimpleNamespace(srcdir=str(srcdir)), "chapters/03_x", source)
    return source[0]


def test_a_changed_result_changes_the_chapters_cache_key(tmp_path):
    (tmp_path / "results").mkdir()
    recorded = tmp_path / "results" / "run_h200.json"
    recorded.write_text('{"tok_s": 100}')
    first = read_as_sphinx_does(CHAPTER, tmp_path)
    assert "run_h200.json sha256:" in first and "remove-cell" in first
    assert read_as_sphinx_does(CHAPTER, tmp_path) == first, "same inputs, same text"
    recorded.write_text('{"tok_s": 200}')
    second = read_as_sphinx_does(CHAPTER, tmp_path)
    assert cache_key(first) != cache_key(second)
    assert len(jupytext.reads(second, fmt="myst").cells) == len(jupytext.reads(CHAPTER, fmt="myst").cells) + 1


def test_a_chapter_that_reads_no_results_is_left_alone(tmp_path):
    (tmp_path / "results").mkdir()
    assert read_as_sphinx_does(CHAPTER.replace("run_h200", "absent"), tmp_path) == CHAPTER.replace(
        "run_h200", "absent")
    source = [CHAPTER]
    (tmp_path / "results" / "run_h200.json").write_text("{}")
    results_inputs.stamp(SimpleNamespace(srcdir=str(tmp_path)), "intro", source)
    assert source == [CHAPTER], "only chapter pages"


def test_the_real_chapters_inputs_are_found():
    text = (ROOT / "chapters/10_scheduler.md").read_text()
    found = [p.name for p in results_inputs.results_read(text, ROOT / "results")]
    assert "policies_h200.json" in found and all((ROOT / "results" / n).exists() for n in found)


def test_figures_are_numbered_per_chapter():
    env = SimpleNamespace(toc_fignumbers={
        "chapters/02_fragmentation": {"figure": {"fig-a": (1,), "fig-b": (2,)}},
        "intro": {"figure": {"fig-c": (1,)}},
    })
    chapter_numbers.prefix_figure_numbers(None, env)
    chapter_numbers.prefix_figure_numbers(None, env)  # twice changes nothing more
    assert env.toc_fignumbers["chapters/02_fragmentation"]["figure"] == {"fig-a": (2, 1), "fig-b": (2, 2)}
    assert env.toc_fignumbers["intro"]["figure"] == {"fig-c": (1,)}


def test_repository_links_follow_the_config():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url, branch = config["repository"]["url"], config["repository"]["branch"]
    assert repository_links.blob_url(url, branch, "tests/test_engine.py") == \
        f"{url}/blob/{branch}/tests/test_engine.py"
    assert repository_links.split("the tests <tests/x.py>") == ("the tests", "tests/x.py")
    assert repository_links.split("tests/x.py") == (None, "tests/x.py")
    assert "https://github.com/" not in (ROOT / "chapters/05_sharing.md").read_text()


def test_the_download_menu_offers_the_twin():
    context = {"pathto": lambda name, resource: f"../{name}", "header_buttons": [
        {"label": "download-buttons", "buttons": [{"text": ".md"}, {"text": ".ipynb"}]}]}
    app = SimpleNamespace(srcdir=str(ROOT))
    colab_button.add_notebook_download(app, "chapters/03_block_tables", None, context, None)
    buttons = context["header_buttons"][0]["buttons"]
    assert [b["text"] for b in buttons] == [".ipynb", ".md"]
    assert buttons[0]["url"] == "../notebooks/03_block_tables.ipynb"
    json.loads((ROOT / "notebooks/03_block_tables.ipynb").read_text())


def test_the_book_config_turns_them_on():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    sphinx = config["sphinx"]
    for name in ("colab_button", "repository_links", "chapter_numbers", "results_inputs"):
        assert sphinx["local_extensions"].get(name) == "_ext", name
        assert (ROOT / "_ext" / f"{name}.py").exists()
    assert sphinx["config"]["nb_merge_streams"] is True and sphinx["config"]["numfig"] is True
    assert config["html"]["use_download_button"] is True
