"""Sphinx extension: a Colab launch button that opens a chapter's .ipynb twin in notebooks/.

The theme's own Colab button links to the page's source file, and Colab cannot open MyST Markdown.
This adds, on every page under chapters/, a rocket-menu button pointing at
notebooks/<chapter>.ipynb in the repository and branch set once in _config.yml, and a ".ipynb"
entry in the download menu: the same twin, copied into the built site (``notebooks/``), so a
reader can run the chapter in any Jupyter.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

COLAB = "https://colab.research.google.com/github"


def colab_url(repository_url: str, branch: str, pagename: str) -> str | None:
    """Colab URL of the notebook twin of a chapter page, or None for other pages."""
    page = PurePosixPath(pagename)
    if page.parent.name != "chapters":
        return None
    org_repo = repository_url.rstrip("/").split("github.com/")[-1]
    return f"{COLAB}/{org_repo}/blob/{branch}/notebooks/{page.name}.ipynb"


def add_colab_button(app, pagename, templatename, context, doctree):
    options = app.config.html_theme_options
    url = colab_url(options.get("repository_url", ""), options.get("repository_branch", "main"),
                    pagename)
    if url is None or "header_buttons" not in context:
        return
    context["header_buttons"].append({
        "type": "group",
        "tooltip": "Launch interactive content",
        "icon": "fas fa-rocket",
        "label": "launch-buttons",
        "buttons": [{
            "type": "link",
            "text": "Colab",
            "tooltip": "Open this chapter's notebook on Colab",
            "icon": "_static/images/logo_colab.png",
            "url": url,
        }],
    })


def add_notebook_download(app, pagename, templatename, context, doctree):
    """The download menu's ".ipynb": this chapter's twin, in place of any other notebook file."""
    page = PurePosixPath(pagename)
    twin = Path(app.srcdir) / "notebooks" / f"{page.name}.ipynb"
    if page.parent.name != "chapters" or not twin.exists() or "header_buttons" not in context:
        return
    group = next((b for b in context["header_buttons"] if b.get("label") == "download-buttons"), None)
    if group is None:
        return
    group["buttons"] = [b for b in group["buttons"] if b.get("text") != ".ipynb"]
    group["buttons"].insert(0, {
        "type": "link",
        "url": context["pathto"](f"notebooks/{twin.name}", 1),
        "text": ".ipynb",
        "icon": "fas fa-code",
        "tooltip": "Download this chapter as a notebook",
        "label": "download-notebook-button",
    })


def copy_twins(app, exception):
    """Put the twins beside the pages, where the download menu points."""
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "notebooks"
    target.mkdir(parents=True, exist_ok=True)
    for twin in sorted((Path(app.srcdir) / "notebooks").glob("*.ipynb")):
        shutil.copy2(twin, target / twin.name)


def setup(app):
    app.connect("html-page-context", add_notebook_download, priority=600)
    app.connect("build-finished", copy_twins)
    # After the theme has prepared header_buttons (its handlers run at the default priority 500).
    app.connect("html-page-context", add_colab_button, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
