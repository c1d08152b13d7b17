"""Runbooks: ``runbooks/<AlertName>.md`` in the repository, served by the agent at ``/runbooks/<AlertName>``.

They are read from the package (``inferwatch.agent.common.assets.runbooks_dir()``), so an installed wheel serves the
same files as a checkout. A name is looked up in the directory listing taken when the agent starts, never joined into a
path, so no request can read outside the directory. The directory's README is about the runbooks, not one of them:
neither listed nor served.

A runbook is served as an HTML page rendered from its Markdown (markdown-it-py, CommonMark and tables, raw HTML in the
Markdown escaped: no script reaches the page), or as the Markdown itself, ``text/markdown``, when the client asks for
it: ``?format=md`` or an ``Accept`` naming ``text/markdown`` or ``text/plain`` and not ``text/html``
(:func:`wants_markdown`). The agent and deploy/runbook_server.py serve them the same way.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from inferwatch.agent.common.assets import Traversable, runbooks_dir

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")  # CamelCase alert names, as in the rule files
NOT_RUNBOOKS = frozenset({"README"})  # runbooks/README.md: how the runbooks are written, not an alert's runbook
MAX_RUNBOOK_BYTES = 256 * 1024
MARKDOWN_FORMATS = frozenset({"md", "markdown"})  # ?format= values that ask for the Markdown
MARKDOWN_TYPE = "text/markdown; charset=utf-8"
HTML_TYPE = "text/html; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Runbooks:
    """The runbook files found in ``directory`` (name → path), read on request."""

    directory: Traversable
    files: dict[str, Traversable]

    @classmethod
    def load(cls, directory: Traversable | None = None) -> Runbooks:
        """The runbooks in ``directory``, by default those the package ships."""
        directory = runbooks_dir() if directory is None else directory
        files: dict[str, Traversable] = {}
        if directory.is_dir():
            for path in sorted(directory.iterdir(), key=lambda p: p.name):
                stem, dot, ext = path.name.rpartition(".")
                if dot and ext == "md" and NAME_RE.match(stem) and stem not in NOT_RUNBOOKS and path.is_file():
                    files[stem] = path
        return cls(directory, files)

    def names(self) -> list[str]:
        return sorted(self.files)

    def read(self, name: str) -> str | None:
        """The runbook's Markdown, or None for an unknown or unreadable name."""
        path = self.files.get(name) if NAME_RE.match(name) else None
        if path is None:
            return None
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_RUNBOOK_BYTES + 1)
        except OSError:
            return None
        return data[:MAX_RUNBOOK_BYTES].decode("utf-8", errors="replace")


def wants_markdown(format: str | None, accept: str) -> bool:
    """Whether a request asks for the Markdown rather than the page: ``?format=md`` (``html``: the page), else an
    Accept header that names text/markdown or text/plain and not text/html. A browser, and a client that names
    nothing (``*/*``), get the page."""
    if format:
        return format.lower() in MARKDOWN_FORMATS
    accept = accept.lower()
    return "text/html" not in accept and ("text/markdown" in accept or "text/plain" in accept)


@cache
def _renderer() -> MarkdownIt:
    from markdown_it import MarkdownIt

    # "html": False escapes any HTML in the Markdown; markdown-it-py also refuses javascript:/vbscript:/data: links.
    return MarkdownIt("commonmark", {"html": False}).enable("table")


STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:100ch;margin:1.5em auto;padding:0 1em;line-height:1.45}"
    "pre{background:#f4f4f4;padding:.6em;overflow-x:auto}code{font-family:ui-monospace,monospace}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em}nav{font-size:.9em}"
)


def to_html(name: str, markdown: str) -> str:
    """The runbook as an HTML page rendered from its Markdown, with a link to the raw Markdown (``?format=md``)."""
    title = html.escape(name)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title} — inferwatch runbook</title><style>{STYLE}</style></head>\n"
        f'<body><nav><a href="{title}?format=md">Markdown</a></nav>\n<main>\n'
        f"{_renderer().render(markdown)}</main></body></html>\n"
    )
