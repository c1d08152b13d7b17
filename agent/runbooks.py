"""Runbooks: ``runbooks/<AlertName>.md`` in the repository, served by the agent at ``/runbooks/<AlertName>``.

They are read from the package (``agent.assets.runbooks_dir()``), so an installed wheel serves the same files
as a checkout. A name is looked up in the directory listing taken when the agent starts, never joined into a path, so no
request can read outside the directory. Markdown is returned as ``text/markdown`` or, for browsers, as a
minimal HTML page (the Markdown escaped inside ``<pre>``: no renderer, no script).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from agent.assets import Traversable, runbooks_dir

NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")  # CamelCase alert names, as in the rule files
MAX_RUNBOOK_BYTES = 256 * 1024


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
                if dot and ext == "md" and NAME_RE.match(stem) and path.is_file():
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


def to_html(name: str, markdown: str) -> str:
    """A minimal, script-free HTML page showing the Markdown as preformatted text."""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>{html.escape(name)} — inferwatch runbook</title></head>\n"
        '<body><pre style="white-space: pre-wrap; max-width: 100ch; font-family: monospace">'
        f"{html.escape(markdown)}</pre></body></html>\n"
    )
