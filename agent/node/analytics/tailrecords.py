"""The tail explainer's records: the last :data:`HORIZON_S` of finished requests, bounded, in columns.

:class:`RequestRecords` is fed by the receiver's span timings (through
:class:`~inferwatch.agent.node.analytics.explain.RecordingSink`) and read by the explainer
(:mod:`inferwatch.agent.node.analytics.explain`) one model and window at a time (:meth:`RequestRecords.window`, a
copy: no lock held while it computes). :class:`ClientTTFTs` keeps the TTFT each client saw, by trace id.

**Bounds.** At most :data:`CAPACITY` requests for all models together (about :data:`RECORD_BYTES_MAX` bytes each at
most: 4.6 MB in all; request ids are cut to :data:`MAX_REQUEST_ID_BYTES` of UTF-8), for :data:`HORIZON_S` (the 5m
window). The request ids are one column of bytes as wide as the longest id kept (:class:`RequestIds`), not a Python
string each: at 100 req/s and 41-character ids (``chatcmpl-`` and 32 hex digits) 1.3 MB instead of 3.2.
The columns are made for :data:`INITIAL_SLOTS` requests and doubled when they are full, up to :data:`CAPACITY`: an
agent pays for the records its traffic keeps (at 100 req/s, 8,192 slots after a minute, 32,768 by five), not for the
bound at start. They do not shrink: after a burst they stay at its size, at most the bound.
Sampling rule above the bound: each :data:`SUB_WINDOW_S` sub-window may keep :data:`SUB_WINDOW_BUDGET` requests
(115 req/s); when the previous sub-window received more, a request is kept 1 in k (k = ceil(received / budget),
systematic by arrival order) with weight k, except that a request at or above its model's last published P95 TTFT
or e2e is always kept, with weight 1, so the slowest requests are never sampled away. When even that overflows, the
oldest records go first (the window says how many seconds it really covers).

**Attributes.** A record's prompt-length band (:data:`PROMPT_BANDS`), whether it was preempted, and its label set
(``dp_rank``, ``lora``, ``tenant``; at most :data:`MAX_LABEL_SETS`) are kept as one int (:func:`_code`), read back as
``(attribute, value)`` pairs by :func:`code_keys`.
"""

from __future__ import annotations

import math
import threading
from array import array
from bisect import bisect_left as _bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inferwatch.agent.common.samples import RequestTiming

CAPACITY = 36_864
INITIAL_SLOTS = 1_024  # the columns' first size; doubled when full, up to CAPACITY
HORIZON_S = 300.0
SUB_WINDOW_S = 10.0
SUB_WINDOW_BUDGET = 1_152  # 30 sub-windows x 1152 = 34 560, the rest of CAPACITY is for the always-kept slow ones
MAX_REQUEST_ID_BYTES = 64  # UTF-8 bytes of a request id kept (a character cut in two is left out)
MAX_LABEL_SETS = 4_096  # distinct (dp_rank, lora, tenant) combinations kept; beyond that they read "other"
RECORD_BYTES_MAX = 126  # a double, 6 floats, 3 int32, a 16-byte trace id, uint16, uint32, a 64-byte id, its length
PROMPT_BANDS = (1024, 4096, 16384)  # prompt tokens: <=1k, 1k-4k, 4k-16k, >16k
# client TTFTs kept by trace id, waiting for (or beside) their engine record: ~3.1 MB when full (measured 6.9 MB for
# 36,864), so at 100 req/s the last ~160 s of requests can be reconciled, all of the 5-minute window below 55 req/s
CLIENT_CAPACITY = 16_384
_NAN = math.nan
FLOAT_COLUMNS = ("t", "ttft", "e2e", "queue", "prefill", "decode", "weight")


def _float_column(column: str, n: int) -> array[float]:
    """``n`` zeros of a float column: the stamp a double, the durations and the weight 32-bit floats."""
    return array("d", bytes(8 * n)) if column == "t" else array("f", bytes(4 * n))


def _band_names() -> tuple[str, ...]:
    return (*(prompt_band(b) for b in PROMPT_BANDS), prompt_band(PROMPT_BANDS[-1] + 1))


def prompt_band(tokens: int) -> str:
    if tokens < 0:
        return "unknown"
    lo = 0
    for hi in PROMPT_BANDS:
        if tokens <= hi:
            return f"{_k(lo)}-{_k(hi)}" if lo else f"<={_k(hi)}"
        lo = hi
    return f">{_k(lo)}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


_BAND_NAMES = _band_names()


class RequestRecords:
    """The last :data:`HORIZON_S` of finished requests, in a ring of columns that grows to ``capacity`` (thread-safe).

    The ring has ``_slots`` slots (:data:`INITIAL_SLOTS` at first); a record that finds it full doubles it (the live
    records copied in arrival order to its start) until it holds ``capacity``, and only then overwrites the oldest.
    """

    def __init__(self, capacity: int = CAPACITY, budget: int = SUB_WINDOW_BUDGET) -> None:
        self.capacity = capacity
        self.budget = budget
        self._lock = threading.Lock()
        n = self._slots = min(capacity, INITIAL_SLOTS)
        # the stamp in a double (seconds since the epoch); the durations and the weight in 32-bit floats: 7 digits, a
        # microsecond below 10 s, and 24 bytes a record less (0.8 MB of the 5-minute window at 100 req/s)
        self._f = {c: _float_column(c, n) for c in FLOAT_COLUMNS}
        self._i = {c: array("i", [-1]) * n for c in ("prompt", "completion", "preemptions")}
        self._model = array("H", bytes(2 * n))
        self._code = array("I", bytes(4 * n))  # attribute code (:func:`_code`): label set, band, preempted
        self._trace = bytearray(16 * n)
        self._request = RequestIds(n)
        self._models: dict[str, int] = {}
        self._model_names: list[str] = []
        self._labels: dict[tuple[tuple[str, str], ...], int] = {(): 0}
        self._label_sets: list[tuple[tuple[str, str], ...]] = [()]
        self._next = 0  # the slot the next record goes to
        self._size = 0
        self._slot = -1  # the current sub-window
        self._received = 0  # requests received in the current sub-window
        self._received_prev = 0
        self._skip = 0
        self.slow: dict[str, tuple[float, float]] = {}  # model -> (P95 TTFT, P95 e2e): always kept
        self.sampled_out = 0
        self.overwritten = 0

    def stride(self) -> int:
        """1 in how many ordinary requests is kept now (1: all)."""
        return max(1, math.ceil(self._received_prev / self.budget)) if self._received_prev > self.budget else 1

    def add(self, timings: Iterable[RequestTiming], now: float) -> None:
        with self._lock:
            self._expire(now)
            slot = math.floor(now / SUB_WINDOW_S)
            if slot != self._slot:
                self._received_prev = self._received if slot == self._slot + 1 else 0
                self._slot, self._received = slot, 0
            for t in timings:
                self._received += 1
                k = self.stride()
                s = t.seconds
                ttft, e2e = s.get("ttft", _NAN), s.get("e2e", _NAN)
                weight = 1.0
                if k > 1:
                    p95 = self.slow.get(t.model)
                    if p95 is None or not (ttft >= p95[0] or e2e >= p95[1]):
                        self._skip += 1
                        if self._skip % k:
                            self.sampled_out += 1
                            continue
                        weight = float(k)
                self._put(t, now, ttft, e2e, weight)

    def _put(self, t: RequestTiming, now: float, ttft: float, e2e: float, weight: float) -> None:
        if self._size == self._slots < self.capacity:
            self._grow()
        i = self._next
        if self._size == self._slots:
            self.overwritten += 1
        else:
            self._size += 1
        self._next = (i + 1) % self._slots
        f, s = self._f, t.seconds
        f["t"][i] = now
        f["ttft"][i] = ttft
        f["e2e"][i] = e2e
        f["queue"][i] = s.get("queue", _NAN)
        f["prefill"][i] = s.get("prefill", _NAN)
        f["decode"][i] = s.get("decode", _NAN)
        f["weight"][i] = weight
        ints = self._i
        ints["prompt"][i] = t.prompt_tokens if t.prompt_tokens is not None and t.prompt_tokens < 2**31 else -1
        ints["completion"][i] = (
            t.completion_tokens if t.completion_tokens is not None and t.completion_tokens < 2**31 else -1
        )
        ints["preemptions"][i] = t.preemptions if t.preemptions is not None else -1
        m = self._models.get(t.model)
        if m is None:
            if len(self._model_names) >= 65_535:
                return
            m = self._models[t.model] = len(self._model_names)
            self._model_names.append(t.model)
        self._model[i] = m
        lab = self._labels.get(t.labels)
        if lab is None:
            if len(self._label_sets) < MAX_LABEL_SETS:
                lab = self._labels[t.labels] = len(self._label_sets)
                self._label_sets.append(t.labels)
            else:
                lab = self._labels.setdefault((("labels", "other"),), len(self._label_sets))
                if lab == len(self._label_sets):
                    self._label_sets.append((("labels", "other"),))
        p = ints["prompt"][i]
        self._code[i] = _code(_bisect_left(PROMPT_BANDS, p) if p >= 0 else -1, ints["preemptions"][i], lab)
        tid = bytes.fromhex(t.trace_id) if t.trace_id and len(t.trace_id) == 32 else bytes(16)
        self._trace[16 * i : 16 * i + 16] = tid
        self._request.put(i, t.request_id)

    def _grow(self) -> None:
        """Double the ring (at most to ``capacity``), its records moved to its start in arrival order."""
        old, new = self._slots, min(self.capacity, 2 * self._slots)
        start = (self._next - self._size) % old  # the oldest record's slot (0 when the ring never wrapped)

        def moved(col: Any, fill: Any, width: int = 1) -> Any:  # width: a record's items in the column
            return col[width * start :] + col[: width * start] + fill * (new - old)

        self._f = {c: moved(a, _float_column(c, 1)) for c, a in self._f.items()}
        self._i = {c: moved(a, array("i", [-1])) for c, a in self._i.items()}
        self._model = moved(self._model, array("H", [0]))
        self._code = moved(self._code, array("I", [0]))
        self._trace = moved(self._trace, bytearray(16), 16)
        self._request = self._request.moved(start, new)
        self._next, self._slots = self._size % new, new

    def _expire(self, now: float) -> None:
        """Let go of the records older than :data:`HORIZON_S`: the window no longer reads them (their slots are
        overwritten as the ring turns)."""
        n, cap, t = self._size, self._slots, self._f["t"]
        start, cut = (self._next - n) % cap, now - HORIZON_S
        while n and t[start] < cut:
            start = start + 1 if start + 1 < cap else 0
            n -= 1
        self._size = n

    def models(self) -> list[str]:
        """The models with records kept (any age up to the horizon)."""
        with self._lock:
            present: set[int] = set()
            for lo, hi in self._segments(-math.inf):  # the live slots: one or two runs of the ring
                present.update(self._model[lo:hi])
            return sorted(self._model_names[m] for m in present if m < len(self._model_names))

    def _segments(self, cut: float) -> list[tuple[int, int]]:
        """The ring slots (one or two [start, end) runs) of the records stamped at or after ``cut``."""
        n, cap, t = self._size, self._slots, self._f["t"]
        start = (self._next - n) % cap
        lo, hi = 0, n
        while lo < hi:  # records are in stamp order: binary search for the first one inside the window
            mid = (lo + hi) // 2
            if t[(start + mid) % cap] < cut:
                lo = mid + 1
            else:
                hi = mid
        first, count = (start + lo) % cap, n - lo
        if first + count <= cap:
            return [(first, first + count)]
        return [(first, cap), (0, first + count - cap)]

    def window(self, models: Iterable[str], window_s: float, now: float) -> Window:
        """The records of ``models`` stamped in the last ``window_s``: a copy (C-speed slices), no lock held after."""
        with self._lock:
            wanted = {self._models[m] for m in models if m in self._models}
            cut = now - window_s
            segs = self._segments(cut)
            n = self._size
            oldest = self._f["t"][(self._next - n) % self._slots] if n else now
            # the ring is full and its oldest record is inside the window: older requests were overwritten
            covered = window_s if n < self.capacity or oldest < cut else now - oldest

            def copy(col: array[Any]) -> array[Any]:  # a memcpy
                out = col[0:0]
                for lo, hi in segs:
                    out += col[lo:hi]
                return out

            # arrays, not lists: a float is boxed again on each pass, but the passes then touch a quarter of the
            # memory (8 bytes a value, not a pointer and a 24-byte object), which is faster measured where the
            # agent runs it, beside other work (benchmarks/tail_explain.py --previous: ~20 % less CPU)
            f: dict[str, Sequence[float]] = {c: copy(a) for c, a in self._f.items()}
            ints: dict[str, Sequence[int]] = {c: copy(a) for c, a in self._i.items()}
            codes: Sequence[int] = copy(self._code)
            requests = self._request.take(segs)
            traces = b"".join(bytes(self._trace[16 * lo : 16 * hi]) for lo, hi in segs)
            model = copy(self._model)
            label_sets = list(self._label_sets)
        if not wanted:
            keep: list[int] | None = []
        elif set(model) <= wanted:
            keep = None
        else:
            keep = [j for j, m in enumerate(model) if m in wanted]
        if keep is not None:
            f = {c: [v[j] for j in keep] for c, v in f.items()}
            ints = {c: [v[j] for j in keep] for c, v in ints.items()}
            codes = [codes[j] for j in keep]
            requests = requests.pick(keep)
            traces = b"".join(traces[16 * j : 16 * j + 16] for j in keep)
        return Window(f, ints, codes, label_sets, traces, requests, now, covered, window_s)

    def memory_bytes(self) -> int:
        """What the ring's columns hold now, in bytes (request id strings counted as stored)."""
        columns: list[array[Any]] = [*self._f.values(), *self._i.values(), self._model, self._code]
        fixed = sum(a.itemsize * len(a) for a in columns)
        return fixed + len(self._trace) + self._request.memory_bytes()


@dataclass(frozen=True, slots=True)
class Window:
    """One model's records over one window, as columns (NaN / -1 where the span had no value)."""

    f: dict[str, Sequence[float]]  # t (stamp), ttft, e2e, queue, prefill, decode, weight
    i: dict[str, Sequence[int]]  # prompt, completion, preemptions
    codes: Sequence[int]  # per record its attribute code (:func:`_code`); code >> 5 indexes label_sets
    label_sets: list[tuple[tuple[str, str], ...]]
    traces: bytes  # 16 bytes a record
    requests: RequestIds
    now: float
    covered_s: float
    window_s: float

    def __len__(self) -> int:
        return len(self.requests)

    def trace_id(self, j: int) -> str | None:
        raw = self.traces[16 * j : 16 * j + 16]
        return raw.hex() if any(raw) else None


class RequestIds(Sequence[str | None]):
    """Request ids in one column of bytes, ``width`` bytes a slot (the longest id put so far, at most
    :data:`MAX_REQUEST_ID_BYTES`), and each slot's length (0: no id). Read back as strings (None where absent)."""

    __slots__ = ("_blob", "_lens", "width")

    def __init__(self, slots: int = 0, width: int = 0) -> None:
        self.width = width
        self._blob = bytearray(width * slots)
        self._lens = array("B", bytes(slots))

    def put(self, slot: int, rid: str | None) -> None:
        raw = rid.encode("utf-8", "replace")[:MAX_REQUEST_ID_BYTES] if rid else b""
        if len(raw) > self.width:
            self._widen(len(raw))
        w = self.width
        self._blob[w * slot : w * slot + len(raw)] = raw
        self._lens[slot] = len(raw)

    def _widen(self, width: int) -> None:
        """Every slot ``width`` bytes wide (a longer id came: at most :data:`MAX_REQUEST_ID_BYTES`)."""
        old, n = self.width, len(self._lens)
        pad = bytes(width - old)
        blob = bytearray(width * n)
        if old:
            blob[:] = b"".join(self._blob[old * k : old * k + old] + pad for k in range(n))
        self._blob, self.width = blob, width

    def moved(self, start: int, slots: int) -> RequestIds:
        """The column with slot ``start`` first (the ring's oldest record), grown to ``slots`` slots."""
        out, w = RequestIds(0, self.width), self.width
        out._blob = self._blob[w * start :] + self._blob[: w * start] + bytes(w * (slots - len(self._lens)))
        out._lens = self._lens[start:] + self._lens[:start] + array("B", bytes(slots - len(self._lens)))
        return out

    def take(self, segments: Iterable[tuple[int, int]]) -> RequestIds:
        """The slots of ``segments`` ([start, end) runs), in that order: a copy."""
        out, w = RequestIds(0, self.width), self.width
        for lo, hi in segments:
            out._blob += self._blob[w * lo : w * hi]
            out._lens += self._lens[lo:hi]
        return out

    def pick(self, keep: Sequence[int]) -> RequestIds:
        out, w = RequestIds(0, self.width), self.width
        out._blob = bytearray(b"".join(self._blob[w * j : w * j + w] for j in keep))
        out._lens = array("B", (self._lens[j] for j in keep))
        return out

    def memory_bytes(self) -> int:
        return len(self._blob) + len(self._lens)

    def __len__(self) -> int:
        return len(self._lens)

    def __getitem__(self, j: int) -> str | None:  # type: ignore[override]
        n = self._lens[j]
        if not n:
            return None
        at = self.width * (j % len(self._lens))
        return self._blob[at : at + n].decode("utf-8", "ignore")


def _code(band: int, preemptions: int, label: int) -> int:
    """A record's attribute values in one int, computed when it is recorded: (band + 1) + 8 x (preempted + 1) +
    32 x label set, band -1 (no prompt count) .. 3, preempted -1 (not known), 0 or 1."""
    return band + 1 + 8 * (min(preemptions, 1) + 1) + 32 * label


def code_keys(code: int, label_sets: Sequence[tuple[tuple[str, str], ...]]) -> tuple[tuple[str, str], ...]:
    """The ``(attribute, value)`` pairs of an attribute code (:func:`_code`): the prompt band and whether the request
    was preempted where known, then its label set (``label_sets``: the window's, indexed by ``code >> 5``)."""
    lab, rem = divmod(code, 32)
    pre, band = rem // 8 - 1, rem % 8 - 1
    parts = [] if band < 0 else [("prompt_tokens", _BAND_NAMES[band])]
    if pre >= 0:
        parts.append(("preempted", "yes" if pre else "no"))
    return (*parts, *label_sets[lab])


class ClientTTFTs:
    """Client TTFTs by trace id, at most :data:`CLIENT_CAPACITY` (the oldest go first) and :data:`HORIZON_S` old."""

    def __init__(self, capacity: int = CLIENT_CAPACITY) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._by_trace: dict[str, tuple[float, float]] = {}  # insertion order = arrival order

    def add(self, pairs: Iterable[tuple[str, float]], now: float) -> None:
        with self._lock:
            for trace_id, ttft in pairs:
                self._by_trace.pop(trace_id, None)
                self._by_trace[trace_id] = (ttft, now)
            self._expire(now)

    def _expire(self, now: float) -> None:
        d, cut = self._by_trace, now - HORIZON_S
        while d:
            oldest = next(iter(d))
            if len(d) <= self.capacity and d[oldest][1] >= cut:
                break
            del d[oldest]

    def snapshot(self, now: float) -> dict[str, float]:
        with self._lock:
            self._expire(now)
            return {k: v[0] for k, v in self._by_trace.items()}

    def __len__(self) -> int:
        return len(self._by_trace)
