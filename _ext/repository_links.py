"""Sphinx extension: the ``{repo}`` role links a file of the course's repository.

``{repo}`tests/test_engine.py``` shows the path in code font and links it on GitHub, at the
repository and branch set once in _config.yml (``repository.url`` and ``repository.branch``), so a
fork's book links the fork. ``{repo}`the engine tests <tests/test_engine.py>``` sets the text.
The Colab twins turn the same role into a Markdown link (tools/colab_twin.py).
"""

from __future__ import annotations

import re

from docutils import nodes


def blob_url(repository_url: str, branch: str, path: str) -> str:
    """The GitHub page of ``path`` in the repository, on ``branch``."""
    return f"{repository_url.rstrip('/')}/blob/{branch}/{path.lstrip('/')}"


def split(content: str) -> tuple[str | None, str]:
    """``text <path>`` -> (text, path); a bare ``path`` -> (None, path)."""
    explicit = re.match(r"^(.*?)\s*<([^>]+)>$", content)
    return (explicit[1], explicit[2]) if explicit else (None, content)


def repo_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    config = inliner.document.settings.env.app.config
    theme = config.html_theme_options or {}
    words, path = split(text)
    url = blob_url(theme.get("repository_url", ""), theme.get("repository_branch", "main"), path)
    shown = nodes.Text(words) if words else nodes.literal(path, path)
    return [nodes.reference(rawtext, "", shown, refuri=url)], []


def setup(app):
    app.add_role("repo", repo_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
