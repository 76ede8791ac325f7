"""The Markdown of a Colab twin: a chapter's MyST turned into the Markdown Colab renders.

Colab shows CommonMark with ``$math$``; it knows nothing of MyST's roles, directives and targets.
``BookContext.markdown(source)`` rewrites one Markdown cell:

- ``{glue:text}`name:fmt``` becomes the value of the book's own run of the chapter, formatted as
  ``fmt`` asks, exactly as myst-nb formats it. A twin's outputs are stripped and the execution cache
  is not part of the repository, so the values come from a record, ``notebooks/glued/NN_name.json``
  (``tools/record_glued_values.py`` writes it from an executed chapter: every glued value's
  ``text/plain``, with the device and the date of the run). A note at the top of the twin says so,
  and that running the cells computes the reader's own numbers (``glue`` returns the value it is
  given; myst-nb's own ``glue`` only emits a MIME type Colab does not render). A name the record
  lacks stays a placeholder, ``⟨`name`⟩``, and the note says what it stands for.
- ``{cite}`key``` becomes a link to the entry's URL (or DOI) in ``references.bib``, author-year.
- ``{numref}`` and ``{ref}`` become the target's own words: a figure's caption, a section's title,
  an exercise's number, or the text the role gives.
- Exercises become quoted text; solutions are folded in ``<details><summary>Solution</summary>``.
- A link to a chapter (``NN_name.md``) points at that chapter's Colab twin; ``{repo}`path``` at
  the file on GitHub.
- Admonitions, margins and other directives become quoted text under a bold title; ``{figure}``
  and ``{glue:figure}`` a caption in italics; a ``(label)=`` target an HTML anchor.
"""

from __future__ import annotations

import re
from ast import literal_eval
from dataclasses import dataclass, field
from pathlib import Path

COLAB = "https://colab.research.google.com/github"

GLUE_PLACEHOLDER_NOTE = (
    "A name in angle brackets, like ⟨`name`⟩, stands for a number the recorded run did not "
    "produce: the code cell that calls `glue(\"name\", value)` computes it."
)


def glue_note(record: dict | None, placeholders: bool) -> str:
    """The note at the top of a twin whose prose shows glued numbers."""
    if not record:
        return ("*About the numbers:* in the book, the numbers in the text are filled in by the "
                "code. " + GLUE_PLACEHOLDER_NOTE + " `glue` returns the value it is given, so "
                "wrap that call in `print(...)` to see it.")
    note = (f"*About the numbers:* the numbers in the text come from the book's own run of this "
            f"chapter (device: {record.get('device', 'not recorded')}; "
            f"date: {record.get('date', 'not recorded')}). Running the cells computes your own: "
            "the code cell that calls `glue(\"name\", value)` computes the number called `name`, "
            "and `glue` returns the value it is given, so wrap that call in `print(...)` to see "
            "it. Timings differ from machine to machine, and on a GPU a chapter picks larger "
            "sizes.")
    return note + (" " + GLUE_PLACEHOLDER_NOTE if placeholders else "")


def format_glued(text: str, fmt_spec: str) -> str:
    """A glued value's ``text/plain`` formatted for ``{glue:text}`name:fmt_spec```, as myst-nb
    does it (``myst_nb.core.variables.format_plain_text``)."""
    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if fmt_spec == "":
        return str(value)
    type_char = fmt_spec[-1]
    if type_char == "s":
        value = str(value)
    elif type_char in ("b", "c", "d", "o", "x", "X"):
        value = int(value)
    elif type_char in ("e", "E", "f", "F", "g", "G", "n", "%"):
        value = float(value)
    return format(value, fmt_spec)


def _escaped(text: str) -> str:
    """Plain text in Markdown: no emphasis, link, HTML, math or table cell starts in it."""
    return re.sub(r"([\\`*_\[\]<>$|~])", r"\\\1", text)


ROLE = re.compile(r"\{([\w:.-]+)\}`([^`]*)`")
FENCE_OPEN = re.compile(r"^(?P<indent>\s*)(?P<mark>`{3,}|:{3,})\{(?P<name>[\w:.-]+)\}\s*(?P<args>.*)$")
TARGET = re.compile(r"^\((?P<label>[\w.:-]+)\)=\s*$")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
CHAPTER_LINK = re.compile(r"^(?:\.\./chapters/|\./)?(?P<stem>\d\d_[\w-]+)\.(?:md|ipynb)(?:#[\w-]*)?$")
SUBSTITUTION = re.compile(r"\{\{\s*([\w-]+)\s*\}\}")
OPTION = re.compile(r"^:([\w-]+):\s*(.*)$")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")

ADMONITIONS = {"note", "warning", "tip", "hint", "important", "caution", "attention", "danger",
               "error", "seealso", "admonition", "margin", "sidebar", "topic", "epigraph"}


def colab_url(repository_url: str, branch: str, stem: str) -> str:
    """The Colab URL of chapter ``stem``'s twin in ``notebooks/``."""
    org_repo = repository_url.rstrip("/").split("github.com/")[-1]
    return f"{COLAB}/{org_repo}/blob/{branch}/notebooks/{stem}.ipynb"


def _first_sentence(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    cut = re.split(r"(?<=[a-z0-9)])\.\s", text, maxsplit=1)[0].rstrip(".")
    return cut if len(cut) <= limit else cut[:limit].rsplit(" ", 1)[0] + " …"


def bibliography(path: Path) -> dict[str, tuple[str, str]]:
    """``key -> (author-year text, URL)`` for every entry of a BibTeX file."""
    from pybtex.database import parse_file

    found: dict[str, tuple[str, str]] = {}
    if not path.exists():
        return found
    for key, entry in parse_file(str(path)).entries.items():
        people = entry.persons.get("author", [])
        last = [" ".join(p.last_names).replace("{", "").replace("}", "") for p in people]
        if not last:
            who = entry.fields.get("organization", entry.fields.get("title", key)).strip("{}")
        elif len(last) == 1:
            who = last[0]
        elif len(last) == 2:
            who = f"{last[0]} and {last[1]}"
        else:
            who = f"{last[0]} et al."
        url = entry.fields.get("url", "")
        if not url and entry.fields.get("doi"):
            url = f"https://doi.org/{entry.fields['doi']}"
        found[key] = (f"{who}, {entry.fields.get('year', 'n.d.')}", url)
    return found


@dataclass
class BookContext:
    """What the rewrite needs to know about the whole book."""

    repository_url: str
    branch: str
    references: dict[str, tuple[str, str]] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)  # label -> words for a reference to it
    substitutions: dict[str, str] = field(default_factory=dict)
    glued: dict[str, str] = field(default_factory=dict)  # name -> text/plain, of this chapter's run
    placeholders: set[str] = field(default_factory=set)  # names shown as ⟨`name`⟩: not recorded

    # ----------------------------------------------------------------- targets of the whole book
    def collect_targets(self, notebook) -> None:
        """Record the labels a chapter defines: sections, figures, exercises."""
        for cell in notebook.cells:
            if cell.cell_type == "code":
                figure = (cell.metadata.get("mystnb") or {}).get("figure") or {}
                if figure.get("name"):
                    self.targets[figure["name"]] = (
                        f"Figure “{_first_sentence(figure.get('caption', ''))}”")
                continue
            lines = cell.source.split("\n")
            for i, line in enumerate(lines):
                target = TARGET.match(line)
                if target:
                    heading = next((HEADING.match(l) for l in lines[i + 1:] if l.strip()), None)
                    if heading:
                        self.targets[target["label"]] = f"“{_plain_title(heading[1])}”"
                opened = FENCE_OPEN.match(line)
                if opened:
                    options = dict(m.groups() for m in map(OPTION.match, lines[i + 1:i + 6]) if m)
                    label = options.get("label") or options.get("name")
                    if not label:
                        continue
                    if opened["name"] == "exercise":
                        number = opened["args"].split(" ", 1)[0]
                        self.targets[label] = f"Exercise {number}"
                    else:
                        body = [l for l in lines[i + 1:i + 12] if l.strip() and not OPTION.match(l)]
                        self.targets[label] = f"“{_first_sentence(' '.join(body[:3]))}”"

    # ----------------------------------------------------------------------------- rewriting
    def markdown(self, source: str) -> str:
        """One Markdown cell of a chapter, as Markdown that Colab renders."""
        return "\n".join(self._blocks(source.split("\n")))

    def _blocks(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        plain_fence = None
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if plain_fence:  # inside an ordinary code block: copy as it is
                out.append(line)
                if stripped.startswith(plain_fence) and not stripped.strip(plain_fence[0]):
                    plain_fence = None
                i += 1
                continue
            opened = FENCE_OPEN.match(line)
            if opened:
                end = _closing(lines, i + 1, opened["mark"])
                out += self._directive(opened["name"], opened["args"].strip(), lines[i + 1:end])
                i = end + 1
                continue
            if re.match(r"^\s*(`{3,}|~{3,})", line):
                plain_fence = re.match(r"^\s*(`{3,}|~{3,})", line)[1]
                out.append(line)
                i += 1
                continue
            target = TARGET.match(line)
            if target:
                out.append(f'<a id="{target["label"]}"></a>')
            else:
                out.append(self.inline(line))
            i += 1
        return out

    def _directive(self, name: str, args: str, body: list[str]) -> list[str]:
        options = {}
        while body and OPTION.match(body[0]):
            key, value = OPTION.match(body[0]).groups()
            options[key] = value
            body = body[1:]
        text = _strip_blank(self._blocks(body))
        if name in ("code-block", "code", "sourcecode"):
            return [f"```{args}", *body, "```"]
        if name in ("math",):
            return ["$$", *body, "$$"]
        if name == "exercise":
            number, _, title = args.partition(" ")
            head = f"**Exercise {number}** {self.inline(title)}".rstrip()
            return _quoted([head, "", *text])
        if name == "solution":
            exercise = self.targets.get(args.strip(), "")
            summary = f"Solution to {exercise}" if exercise.startswith("Exercise") else "Solution"
            return [f"<details><summary>{summary}</summary>", "", *text, "", "</details>"]
        if name in ("figure", "image"):
            caption = " ".join(text)
            alt = options.get("alt", caption[:60])
            return [f"![{alt}]({args})", "", f"*{caption}*" if caption else ""]
        if name.startswith("glue:") or name == "glue":
            glued = args.split(":", 1)[0]
            caption = " ".join(text)
            made = (f"made by the code cell that calls `glue(\"{glued}\", ...)`; `glue` returns it, "
                    "so `display(glue(...))` shows it there")
            return [f"*Figure: {caption}* ({made}.)" if caption else f"*A figure {made}.*"]
        title = self.inline(args) if args else name.capitalize()
        if name not in ADMONITIONS:
            title = title or name
        return _quoted([f"**{title}**", "", *text])

    def inline(self, line: str) -> str:
        """Roles, chapter links and substitutions of one line of text."""
        line = SUBSTITUTION.sub(lambda m: self.substitutions.get(m[1], m[0]), line)
        line = ROLE.sub(self._role, line)
        return LINK.sub(self._link, line)

    def _role(self, match: re.Match) -> str:
        name, content = match[1], match[2]
        if name in ("glue:text", "glue", "glue:any", "glue:md"):
            key, fmt_spec = content.rsplit(":", 1) if ":" in content else (content, "s")
            if name != "glue:text":  # no format spec: the value as it was displayed
                key, fmt_spec = content, ""
            key = key.strip()
            if key in self.glued:
                try:
                    return _escaped(format_glued(self.glued[key], fmt_spec))
                except (ValueError, TypeError):
                    pass
            self.placeholders.add(key)
            return f"⟨`{key}`⟩"
        if name in ("cite", "cite:p", "cite:t", "cite:ps", "cite:ts"):
            cited = []
            for key in (k.strip() for k in content.split(",")):
                words, url = self.references.get(key, (key, ""))
                cited.append(f"[{words}]({url})" if url else words)
            return "(" + "; ".join(cited) + ")"
        if name in ("numref", "ref", "eq", "doc", "term", "abbr"):
            explicit = re.match(r"^(?P<text>.*?)\s*<(?P<label>[^>]+)>$", content)
            if explicit:
                words = explicit["text"]
                if "%s" in words or "{number}" in words:
                    label_words = self.targets.get(explicit["label"], explicit["label"])
                    words = words.replace("%s", label_words).replace("{number}", label_words)
                return words
            if name == "eq":
                return f"equation ({content})"
            return self.targets.get(content, content)
        if name == "repo":  # a file of the repository (_ext/repository_links.py)
            explicit = re.match(r"^(?P<text>.*?)\s*<(?P<path>[^>]+)>$", content)
            words, path = (explicit["text"], explicit["path"]) if explicit else (f"`{content}`", content)
            url = f"{self.repository_url.rstrip('/')}/blob/{self.branch}/{path.lstrip('/')}"
            return f"[{words}]({url})"
        if name in ("math",):
            return f"${content}$"
        return content  # {sub}, {sup}, {kbd}, ...: their text

    def _link(self, match: re.Match) -> str:
        text, target = match["text"], match["target"]
        chapter = CHAPTER_LINK.match(target)
        if chapter:
            return f"[{text}]({colab_url(self.repository_url, self.branch, chapter['stem'])})"
        if re.match(r"^[\w.:-]+$", target) and target in self.targets:
            return f"[{text}](#{target})"
        return match[0]


def _plain_title(heading: str) -> str:
    return re.sub(r"[*_`$]", "", heading).strip()


def _closing(lines: list[str], start: int, mark: str) -> int:
    """The index of the line that closes a fence opened with ``mark`` (nested fences skipped)."""
    depth, plain = 0, None
    for j in range(start, len(lines)):
        stripped = lines[j].strip()
        if plain:  # an ordinary code block inside the directive
            if stripped.startswith(plain) and not stripped.strip(plain[0]):
                plain = None
            continue
        code = re.match(r"^(`{3,}|~{3,})[^`{]*$", stripped)
        if code and stripped != code[1]:
            plain = code[1]
            continue
        opened = FENCE_OPEN.match(lines[j])
        if opened and opened["mark"][0] == mark[0] and len(opened["mark"]) == len(mark):
            depth += 1
        elif stripped and stripped[0] == mark[0] and not stripped.strip(mark[0]) \
                and len(stripped) >= len(mark):
            if depth == 0:
                return j
            depth -= 1
    return len(lines)


def _strip_blank(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _quoted(lines: list[str]) -> list[str]:
    return [f"> {line}".rstrip() for line in lines]
