"""A fast, selective reader of the Prometheus text exposition format (engine ``/metrics``).

Hot path of the engine collector: a node serving many models or LoRA adapters exposes tens of
thousands of series per scrape, and the adapter needs a few families. So the reader

1. drops every line that does not start with the engine's prefix (one C-level ``startswith``),
2. takes the sample name and drops it unless the adapter asked for it (one set lookup),
3. only then parses the label block, through a cache keyed by the raw label text (series repeat
   from scrape to scrape, so a warm cache turns label parsing into one dict lookup).

Handled: ``# HELP``/``# TYPE``/other comments (skipped), ``_created`` samples (skipped unless asked
for), escaped label values (``\\\\``, ``\\"``, ``\\n``), label values holding ``}``, ``,`` or ``=``,
a trailing comma in a label set, optional timestamps, OpenMetrics exemplars (``# {..} v``) and
``# EOF``. Input must be UTF-8 text; bytes that are not raise :class:`SourceFormatError`, as does a
wanted line that does not parse (its line number and a prefix of it are in the message).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from agent.errors import SourceFormatError

Labels = tuple[tuple[str, str], ...]


class ExpositionError(SourceFormatError):
    """A wanted line that does not parse; ``lineno`` is 1-based, ``last`` says it is the final line."""

    def __init__(self, message: str, lineno: int, last: bool) -> None:
        super().__init__(message)
        self.lineno = lineno
        self.last = last


Series = list[tuple[Labels, float]]

MAX_LABEL_CACHE_ENTRIES = 200_000  # a bound on memory when series churn (each entry ~ one series)
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}
_SKIP = object()  # a cached head whose name the adapter does not want


@dataclass
class Exposition:
    """Wanted samples by full sample name (``vllm:prompt_tokens_total``), each with labels and value."""

    samples: dict[str, Series] = field(default_factory=dict)
    lines: int = 0  # lines scanned, all of them
    matched: int = 0  # samples kept

    def get(self, name: str) -> Series:
        return self.samples.get(name, [])


def decode(body: bytes) -> str:
    """Decode an exposition body; raise SourceFormatError naming the offset of the first bad byte."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceFormatError(f"not UTF-8 text: invalid byte at offset {exc.start}") from None


class ExpositionReader:
    """Reads samples whose names are in ``wanted`` (all lines start with one of ``prefixes``).

    Keep one reader per target: its label cache is what makes repeated scrapes cheap.
    """

    def __init__(self, prefixes: tuple[str, ...], wanted: Container[str]) -> None:
        self.prefixes = prefixes
        self.wanted = wanted
        self._cache: dict[str, Labels] = {}  # raw label text → parsed labels
        self._heads: dict[str, tuple[str, Labels] | object] = {}  # "name{labels}" → (name, labels) or _SKIP

    def read(self, text: str) -> Exposition:
        out: dict[str, Series] = {}
        heads = self._heads
        wanted = self.wanted
        labels_cache = self._cache
        if len(labels_cache) >= MAX_LABEL_CACHE_ENTRIES:
            labels_cache.clear()
        prefixes = self.prefixes
        lines = text.split("\n")
        matched = 0
        for line in lines:
            if not line.startswith(prefixes):
                continue
            # Fast path: "name{labels} value" seen before → one dict lookup on the text before the value.
            head, _, val = line.rpartition(" ")
            hit = heads.get(head)
            if hit is not None:
                if hit is _SKIP:
                    continue
                try:
                    value = float(val)
                except ValueError:
                    value = self._slow(lines, line)[2]
            else:
                if len(heads) >= MAX_LABEL_CACHE_ENTRIES:
                    heads.clear()
                brace = line.find("{")
                space = line.find(" ")
                if brace != -1 and (space == -1 or brace < space):
                    name = line[:brace]
                    if name not in wanted:
                        heads[head] = _SKIP  # whatever the value: unwanted
                        continue
                    end = _labels_end(line, brace)
                    if end < 0:
                        raise self._error(lines, line, "unterminated label set")
                    raw = line[brace + 1 : end]
                    cached = labels_cache.get(raw)
                    if cached is None:
                        cached = labels_cache[raw] = self._parse_labels(raw, lines, line)
                    labels = cached
                    plain = end + 1 == len(head)
                else:
                    name = head if space == len(head) else _name_of(line)
                    if name not in wanted:
                        heads[head] = _SKIP
                        continue
                    labels = ()
                    plain = space == len(head)
                if plain:  # "name{labels} value": no timestamp, no exemplar, same head every scrape
                    try:
                        value = float(val)
                    except ValueError:
                        value = self._slow(lines, line)[2]
                    hit = heads[head] = (name, labels)
                else:
                    value = self._slow(lines, line)[2]
                    hit = (name, labels)
            name, labels = hit  # type: ignore[misc]
            series = out.get(name)
            if series is None:
                out[name] = [(labels, value)]
            else:
                series.append((labels, value))
            matched += 1
        return Exposition(out, len(lines), matched)

    def _slow(self, lines: list[str], line: str) -> tuple[str, Labels, float, bool]:
        """Parse one line fully: (name, labels, value, plain) — plain: no timestamp and no exemplar."""
        cache = self._cache
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            end = _labels_end(line, brace)
            if end < 0:
                raise self._error(lines, line, "unterminated label set")
            raw = line[brace + 1 : end]
            labels = cache.get(raw)
            if labels is None:
                labels = self._parse_labels(raw, lines, line) if name in self.wanted else ()
                if len(cache) >= MAX_LABEL_CACHE_ENTRIES:
                    cache.clear()
                cache[raw] = labels
            rest = line[end + 1 :]
        else:
            if space == -1:
                name, rest = line.rstrip("\r"), ""
            else:
                name, rest = line[:space], line[space:]
            labels = ()
        parts = rest.split(None, 2)
        if not parts:
            raise self._error(lines, line, "missing value")
        try:
            value = float(parts[0])
        except ValueError:
            raise self._error(lines, line, f"value {parts[0][:40]!r} is not a number") from None
        if len(parts) > 1 and parts[1] != "#":
            try:
                float(parts[1])  # timestamp (milliseconds); validated, not used
            except ValueError:
                raise self._error(lines, line, f"timestamp {parts[1][:40]!r} is not a number") from None
        plain = len(parts) == 1 and rest.startswith(" ") and rest.count(" ") == 1
        return name, labels, value, plain

    def _parse_labels(self, raw: str, lines: list[str], line: str) -> Labels:
        try:
            return parse_labels(raw)
        except ValueError as exc:
            raise self._error(lines, line, str(exc)) from None

    @staticmethod
    def _error(lines: list[str], line: str, why: str) -> ExpositionError:
        # Line numbers are only computed on the error path (never in the loop).
        lineno = next((i + 1 for i, candidate in enumerate(lines) if candidate is line), 0)
        return ExpositionError(f"line {lineno}: {why}: {line[:120]!r}", lineno, lineno == len(lines))


def _name_of(line: str) -> str:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        return line[:brace]
    return line[:space] if space != -1 else line.rstrip("\r")


def _labels_end(line: str, brace: int) -> int:
    """Index of the ``}`` closing the label block opened at ``brace``; -1 when it is not closed."""
    if "\\" not in line:
        # No escapes: every quote delimits a value, so a closing quote is one preceded by an odd
        # number of quotes inside the block.
        pos = line.find('"}', brace)
        while pos != -1:
            if line.count('"', brace, pos) % 2 == 1:
                return pos + 1
            pos = line.find('"}', pos + 1)
        if line.startswith("}", brace + 1):  # empty label set: name{}
            return brace + 1
    # Escapes, a trailing comma, or unusual spacing: scan character by character.
    in_quotes = False
    i = brace + 1
    n = len(line)
    while i < n:
        c = line[i]
        if in_quotes:
            if c == "\\":
                i += 1
            elif c == '"':
                in_quotes = False
        elif c == '"':
            in_quotes = True
        elif c == "}":
            return i
        i += 1
    return -1


def parse_labels(raw: str) -> Labels:
    """Parse the inside of a label block (``a="x",b="y"``) into ((name, value), ...), in order."""
    if "\\" not in raw:
        pieces = raw.split('"')
        if len(pieces) % 2 == 0:
            raise ValueError("unbalanced quotes in label set")
        out = []
        for k in range(0, len(pieces) - 1, 2):
            head = pieces[k].strip()
            if k:
                if not head.startswith(","):
                    raise ValueError("expected ',' between labels")
                head = head[1:].lstrip()
            if not head.endswith("="):
                raise ValueError("expected '=' after label name")
            name = head[:-1].rstrip()
            if not name or not (name[0].isalpha() or name[0] == "_"):
                raise ValueError(f"bad label name {name!r}")
            out.append((name, pieces[k + 1]))
        tail = pieces[-1].strip()
        if tail not in ("", ","):
            raise ValueError(f"unexpected text after labels: {tail[:40]!r}")
        return tuple(out)
    return _parse_labels_escaped(raw)


def _parse_labels_escaped(raw: str) -> Labels:
    out = []
    i, n = 0, len(raw)
    while i < n:
        while i < n and raw[i] in " ,":
            i += 1
        if i >= n:
            break
        eq = raw.find("=", i)
        if eq < 0:
            raise ValueError("expected '=' after label name")
        name = raw[i:eq].strip()
        if not name or not (name[0].isalpha() or name[0] == "_"):
            raise ValueError(f"bad label name {name!r}")
        j = eq + 1
        while j < n and raw[j] == " ":
            j += 1
        if j >= n or raw[j] != '"':
            raise ValueError(f"label {name!r}: value must be quoted")
        j += 1
        buf: list[str] = []
        while True:
            if j >= n:
                raise ValueError(f"label {name!r}: unterminated value")
            c = raw[j]
            if c == "\\":
                if j + 1 >= n:
                    raise ValueError(f"label {name!r}: dangling escape")
                nxt = raw[j + 1]
                buf.append(_UNESCAPE.get(nxt, "\\" + nxt))
                j += 2
            elif c == '"':
                j += 1
                break
            else:
                buf.append(c)
                j += 1
        out.append((name, "".join(buf)))
        while j < n and raw[j] == " ":
            j += 1
        if j < n and raw[j] != ",":
            raise ValueError(f"expected ',' after label {name!r}")
        i = j + 1
    return tuple(out)
