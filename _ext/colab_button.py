"""Sphinx extension: a Colab launch button that opens a chapter's .ipynb twin in notebooks/.

The theme's own Colab button links to the page's source file, and Colab cannot open MyST Markdown.
This adds, on every page under chapters/, a rocket-menu button pointing at
notebooks/<chapter>.ipynb in the repository and branch set once in _config.yml.
"""

from __future__ import annotations

from pathlib import PurePosixPath

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


def setup(app):
    # After the theme has prepared header_buttons (its handlers run at the default priority 500).
    app.connect("html-page-context", add_colab_button, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
