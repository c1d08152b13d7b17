"""Limits on what one engine exposition may make the agent hold, with their defaults.

Modelled on Prometheus' scrape limits: ``max_series`` is ``sample_limit`` (more sample lines reject
the scrape, reason ``sample_limit``, counted before any line is parsed, while the body streams in);
``max_label_value_bytes`` is ``label_value_length_limit`` (reason ``label_value_length_limit``);
``max_label_bytes`` bounds the names and values of one series together (reason ``label_bytes_limit``).
``max_models`` is a cap like the span path's: the first models are kept, the rest dropped and
counted (``inferwatch.engine.models.dropped``); it never fails the scrape. Every hit is counted in
``inferwatch.engine.limit_hits{limit}``. Sizes are UTF-8 bytes.

``max_bad_lines``: a line that breaks the format (a syntax error, a duplicate series, a second TYPE line,
a negative counter) is dropped and counted in ``inferwatch.engine.series.dropped{reason}``, the rest of the
scrape kept (agent/node/engine/exposition.py); past this many in one scrape the scrape fails with that line's
reason, as before: a body that is mostly garbage is not an exposition. 0 makes every bad line fail the scrape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.agent.config import (  # the named defaults live with the settings
    DEFAULT_ENGINE_MAX_LABEL_BYTES,
    DEFAULT_ENGINE_MAX_LABEL_VALUE_BYTES,
    DEFAULT_ENGINE_MAX_MODELS,
    DEFAULT_ENGINE_MAX_SERIES,
    EngineSettings,
)
from inferwatch.agent.node.engine.compiled import compiled_module

DEFAULT_ENGINE_MAX_BAD_LINES = 1_000  # lines dropped per scrape before the scrape fails (see the module doc)
LIMIT_REASONS = ("sample_limit", "label_value_length_limit", "label_bytes_limit")
LIMITS = (*LIMIT_REASONS, "max_models")  # values of the ``limit`` attribute of limit_hits


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The limits of one engine target (see the module docstring); units in the names."""

    max_series: int = DEFAULT_ENGINE_MAX_SERIES
    max_label_value_bytes: int = DEFAULT_ENGINE_MAX_LABEL_VALUE_BYTES
    max_label_bytes: int = DEFAULT_ENGINE_MAX_LABEL_BYTES
    max_models: int = DEFAULT_ENGINE_MAX_MODELS
    max_bad_lines: int = DEFAULT_ENGINE_MAX_BAD_LINES

    @classmethod
    def of(cls, cfg: EngineSettings) -> EngineLimits:
        """The limits ``engine.*`` configures."""
        return cls(cfg.max_series, cfg.max_label_value_bytes, cfg.max_label_bytes, cfg.max_models)


def label_limit_error(labels: tuple[tuple[str, str], ...], limits: EngineLimits) -> tuple[str, str] | None:
    """(reason, why) when a series' labels break a label limit, else None (run once per distinct label set)."""
    total = 0
    for k, v in labels:
        size = len(v) if v.isascii() else len(v.encode())
        if size > limits.max_label_value_bytes:
            return "label_value_length_limit", (
                f"label {k[:40]!r} value is {size} bytes, over the {limits.max_label_value_bytes}-byte limit"
            )
        total += size + (len(k) if k.isascii() else len(k.encode()))
    if total > limits.max_label_bytes:
        return (
            "label_bytes_limit",
            f"labels of one series are {total} bytes, over the {limits.max_label_bytes}-byte limit",
        )
    return None


def count_sample_lines(text: str) -> int:
    """Lines that are neither blank nor comments (``#`` first): the samples ``sample_limit`` counts."""
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    skipped = text.count("\n#") + text.count("\n\n") + text.startswith(("#", "\n"))
    return lines - skipped


def sample_lines_py(chunk: bytes | bytearray, after_newline: bool) -> int:
    """The sample lines (neither blank nor comments) that start in ``chunk``, a piece of a body; ``after_newline``:
    the byte before it was a newline (or it is the body's start). The fetch adds these up as it reads
    (:class:`SampleLineCounter`, ``engine.max_series``); compiled (``_fastparse.sample_lines``), it is one pass
    over the chunk's newlines instead of four searches (~3 ms for a 600 kB body: 10 models x 2 ranks of vLLM). Empty
    lines are found as ``bytes.count`` finds ``b"\\n\\n"``, without overlap: of a run of n of them within a chunk,
    (n + 1) // 2 are taken off."""
    if not chunk:
        return 0
    starts = chunk.count(b"\n") + after_newline - chunk.endswith(b"\n")
    skipped = chunk.count(b"\n#") + chunk.count(b"\n\n")
    if after_newline and chunk[:1] in (b"#", b"\n"):
        skipped += 1
    return starts - skipped


_EXT = compiled_module()
# an extension built before this step was added (a checkout's in-place build not redone) has none: the pure step
sample_lines: Callable[[bytes | bytearray, bool], int] = getattr(_EXT, "sample_lines", sample_lines_py)


class SampleLineCounter:
    """The same count over a body arriving in chunks (bytes), so a fetch stops once it is over the limit."""

    def __init__(self) -> None:
        self.samples = 0
        self._last = b"\n"  # the byte before the next chunk: a start of line

    def feed(self, chunk: bytes) -> int:
        if not chunk:
            return self.samples
        self.samples += sample_lines(chunk, self._last == b"\n")
        self._last = chunk[-1:]
        return self.samples
