"""Ingest of a 20,000-series vLLM-style exposition: inferwatch's reader vs prometheus_client's parser.

Run from the repository root: ``python benchmarks/exposition_ingest.py [--series 20000] [--repeat 15]``.
Reported per case: wall-clock median and best over the interleaved rounds, the speed-ups against the
baseline's median and best, the speed-up of the median CPU time (``process_time``: less moved by
other processes on a shared machine than wall-clock time), and the body's sample lines per second of
that median CPU time.

Both sides read the same text (built with prometheus_client, formatted exactly like vLLM's /metrics).
Baseline: ``prometheus_client.parser.text_string_to_metric_families`` consumed to the end (it parses
every family; it has no way to skip). Ours: :class:`inferwatch.agent.node.engine.exposition.ExpositionReader` as the
collector builds it (``VLLM.reader(EngineLimits())``: the vLLM adapter's families, the default engine
limits, the model cap), cold (a new reader: empty caches) and warm (the collector's case: the same
reader scrape after scrape), alone and with the adapter mapping (``inferwatch.agent.node.engine.adapters.read``),
and the collector's own read (``EngineParser.stream``: the body's bytes fed in 64 KiB chunks, decoded, read and
mapped as they come; cold). Each twice: with the reader's and the adapters' bulk steps compiled (the C extension
``_fastparse``, rows "C extension"; left out where it is not built) and in pure Python (rows "pure Python"); the
streamed read also with every chunk read line by line, as before issue 38 (its baseline); all in the same
interleaved rounds.
Before timing, the samples of every family the adapter uses are asserted identical to the baseline's
(names, labels, values), and so are the per-model quantities derived from either side.

``--compare REV`` also times the reader and adapter of git revision ``REV`` (``agent/node/engine/exposition.py``
and ``adapters.py`` as they were there, loaded beside the current ones) in the same interleaved rounds:
before/after figures from one run. ``--out FILE`` writes the figures as JSON, with the load average
before and after the run (the machine is shared).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from inferwatch.agent.node.engine import adapters, bulkparse, exposition, seriesmaps  # noqa: E402
from inferwatch.agent.node.engine.adapters import VLLM, KeyCache, read  # noqa: E402
from inferwatch.agent.node.engine.bulkparse import PLAIN_LINE  # noqa: E402
from inferwatch.agent.node.engine.exposition import Exposition, ExpositionReader, ReadPass, Series  # noqa: E402
from inferwatch.agent.node.engine.limits import EngineLimits  # noqa: E402
from inferwatch.agent.node.engine.scrape import EngineParser  # noqa: E402
from tests.engine_expo import big_exposition  # noqa: E402


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall-clock seconds of each call; what a call returns is freed after the clock stops (on both sides:
    prometheus_client's families, our reading and reader), as the collector keeps its reader."""
    out = []
    for _ in range(repeat):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        out.append(time.perf_counter() - t0)
        CPU.setdefault(fn, []).append(time.process_time() - c0)
        del result
    return out


CPU: dict[object, list[float]] = {}  # CPU seconds of each call, by function (process_time)


def cold_read(text: str) -> tuple[object, object]:
    reader = VLLM.reader(EngineLimits())
    return reader, reader.read(text)


def cold_stream(body: bytes) -> tuple[object, object]:
    """The collector's read (a new parser: cold): the body streamed in 64 KiB chunks, read and mapped as it comes."""
    parser = EngineParser("vllm")
    stream = parser.stream()
    stream.begin("text/plain")
    for i in range(0, len(body), 1 << 16):
        stream.feed(body[i : i + (1 << 16)])
    return parser, stream.finish()


def cold_stream_by_lines(body: bytes) -> tuple[object, object]:
    """:func:`cold_stream` with every chunk read line by line (``ExpositionReader.feed``), as before the chunks were
    read in bulk: the streamed read's baseline."""

    def by_lines(reader: ExpositionReader, p: ReadPass, text: str) -> None:
        lines = text.split("\n")
        lines.pop()
        reader.feed(p, lines)

    saved = ExpositionReader.feed_text
    ExpositionReader.feed_text = by_lines  # type: ignore[method-assign]
    try:
        return cold_stream(body)
    finally:
        ExpositionReader.feed_text = saved  # type: ignore[method-assign]


def cold_ingest(text: str) -> tuple[object, object]:
    reader = VLLM.reader(EngineLimits())
    return reader, read(VLLM, reader.read(text))


# the bulk steps, by the module that calls them under the name it uses, with what a pure-Python install runs there:
# the reader's pure-Python steps (bulkparse.py), and none of the adapters' (seriesmaps.py: each family sample by sample)
STEPS = [(exposition, name, getattr(bulkparse, f"{name}_py")) for name in bulkparse.STEPS]
STEPS += [(adapters, name, None) for name in seriesmaps.STEPS]
try:  # the compiled steps, where built, even when INFERWATCH_PURE_PARSER made the reader select the pure ones
    from inferwatch.agent.node.engine import _fastparse as EXTENSION  # type: ignore[attr-defined]
except ImportError:
    EXTENSION = None


def with_steps(compiled: bool, fn: Callable[[], object]) -> object:
    """Call ``fn`` with the reader's and the adapters' bulk steps compiled (the C extension) or in pure Python,
    whatever was selected at import (``INFERWATCH_PURE_PARSER``): both rows come from the same process and the same
    interleaved rounds."""
    saved = [(user, name, getattr(user, name)) for user, name, _ in STEPS]
    for user, name, pure in STEPS:
        setattr(user, name, getattr(EXTENSION, name) if compiled else pure)
    try:
        return fn()
    finally:
        for user, name, step in saved:
            setattr(user, name, step)


def steps(compiled: bool, fn: Callable[..., object], *args: object) -> Callable[[], object]:
    return lambda: with_steps(compiled, lambda: fn(*args))


def baseline_samples(text: str, wanted: frozenset[str]) -> Exposition:
    samples: dict[str, Series] = {}
    matched = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in wanted:
                samples.setdefault(s.name, Series()).append(tuple(s.labels.items()), s.value)
                matched += 1
    return Exposition(samples, 0, matched)


def check_identical(text: str, lim: EngineLimits | None = None) -> tuple[int, int]:
    """(samples compared, families): ours and prometheus_client's, equal sample by sample and per model."""
    wanted = VLLM.wanted()
    ours = VLLM.reader(lim or EngineLimits()).read(text)
    theirs = baseline_samples(text, wanted)
    assert set(ours.samples) == set(theirs.samples), set(ours.samples) ^ set(theirs.samples)
    for name, series in theirs.samples.items():
        a = sorted((tuple(sorted(lbl)), v) for lbl, v in ours.samples[name])
        b = sorted((tuple(sorted(lbl)), v) for lbl, v in series)
        assert a == b, f"samples of {name} differ"
    ra, rb = read(VLLM, ours), read(VLLM, theirs)
    assert ra.models.keys() == rb.models.keys()
    for model in ra.models:
        ma, mb = ra.models[model], rb.models[model]
        assert ma.gauges == mb.gauges and ma.counters == mb.counters, model
        assert ma.histograms == mb.histograms and ma.lora == mb.lora, model
    return ours.matched, len(theirs.samples)


def floor_steps(text: str, repeat: int) -> dict[str, float]:
    """Median CPU ms of the bulk steps any pure-Python read of ``text`` pays per sample line (see ``--floor``)."""
    rows = PLAIN_LINE.findall(text)
    values = [value for _, _, value in rows]
    steps: dict[str, Callable[[], object]] = {
        "regex findall (name, label text, value)": lambda: PLAIN_LINE.findall(text),
        "map(float) over the values": lambda: list(map(float, values)),
        "rows transposed (zip)": lambda: list(zip(*rows, strict=True)),
        "str.split into lines (the line-by-line read's)": lambda: text.split("\n"),
    }
    out = {}
    for step, fn in steps.items():
        cpu = []
        for _ in range(repeat):
            c0 = time.process_time()
            fn()
            cpu.append(time.process_time() - c0)
        out[step] = round(statistics.median(cpu) * 1e3, 2)
    return out


def revision_modules(rev: str, into: Path) -> ModuleType:
    """The adapters module of git revision ``rev``, with that revision's exposition module under it."""

    def load(name: str, text: str) -> ModuleType:
        path = into / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout

    # The reader's own modules at that revision, each importing the others at the same revision: since exposition.py
    # was split, the line grammar, label blocks, heap release and OpenMetrics rules live beside it. Before the split,
    # exposition.py alone (its late import of openmetrics then finds the current one, as it always did here).
    listed = ["git", "ls-tree", "--name-only", rev, "agent/node/engine/"]
    present = set(subprocess.run(listed, cwd=ROOT, check=True, capture_output=True, text=True).stdout.split())
    split = "agent/node/engine/textformat.py" in present
    ours = ("heap", "textformat", "openmetrics", "labelblock") if split else ()
    ours = (*ours, "exposition", "adapters")

    def at_rev(text: str) -> str:
        for name in ours:
            text = text.replace(f"from inferwatch.agent.node.engine.{name} import", f"from {name}_at_rev import")
        # its adapters match its own catalog's engine kinds, not necessarily this checkout's (an engine added since)
        return text.replace("if tuple(ADAPTERS) != ENGINE_KINDS:", "if False:")

    module = None
    for name in ours:
        module = load(f"{name}_at_rev", at_rev(show(f"agent/node/engine/{name}.py")))
    assert module is not None
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--compare", metavar="REV", help="also time the reader and adapter of this git revision")
    ap.add_argument("--out", type=Path, help="write the figures as JSON")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also time the bulk steps every pure-Python reading of the body pays (the whole-text read's regex, "
        "map(float) over the values, the rows transposed): what a million samples per second leaves room for",
    )
    args = ap.parse_args()
    load_before = os.getloadavg()

    text, gen = big_exposition(args.series)
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    matched, _ = check_identical(text)
    print(f"exposition: {len(lines)} samples, {len(text) / 1e6:.2f} MB, {len(gen.models)} models x 2 engines")
    print(f"families used by the vLLM adapter: {matched} samples, identical to prometheus_client's (asserted)")

    body = text.encode()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("prometheus_client text_string_to_metric_families", lambda: list(text_string_to_metric_families(text))),
    ]
    modes = [("pure Python", False)]
    if EXTENSION is not None:
        modes.insert(0, ("C extension", True))
    else:
        print("the C extension (_fastparse) is not built here: pure-Python rows only")
    for mode, compiled in modes:
        with_steps(compiled, lambda: check_identical(text))  # each path reads what prometheus_client reads
        warm = VLLM.reader(EngineLimits())
        warm_keys = KeyCache(VLLM.model_labels, "unknown")
        with_steps(compiled, lambda: read(VLLM, warm.read(text), keys=warm_keys))  # noqa: B023  (called at once)
        cases += [
            (f"reader, cold (new label cache), {mode}", steps(compiled, lambda: cold_read(text))),
            (f"reader, warm (collector's case), {mode}", steps(compiled, warm.read, text)),
            (f"reader + vLLM adapter, cold, {mode}", steps(compiled, lambda: cold_ingest(text))),
            (
                f"reader + vLLM adapter, warm, {mode}",
                steps(compiled, lambda w=warm, k=warm_keys: read(VLLM, w.read(text), keys=k)),
            ),
            (f"collector's streamed read, cold, {mode}", steps(compiled, cold_stream, body)),
        ]
    cases.append(("collector's streamed read, cold, line by line", lambda: cold_stream_by_lines(body)))
    if args.compare:
        old = revision_modules(args.compare, Path(tempfile.mkdtemp(prefix="iw-ingest-")))
        old_warm = old.VLLM.reader(EngineLimits())
        old_keys = old.KeyCache(old.VLLM.model_labels, "unknown")
        old.read(old.VLLM, old_warm.read(text), keys=old_keys)

        def old_cold(ingest: bool) -> tuple[object, object]:
            reader = old.VLLM.reader(EngineLimits())
            expo = reader.read(text)
            return reader, old.read(old.VLLM, expo) if ingest else expo

        cases += [
            (f"{args.compare[:10]}: reader, cold", lambda: old_cold(False)),
            (f"{args.compare[:10]}: reader, warm", lambda: old_warm.read(text)),
            (f"{args.compare[:10]}: reader + vLLM adapter, cold", lambda: old_cold(True)),
            (
                f"{args.compare}: reader + vLLM adapter, warm",
                lambda: old.read(old.VLLM, old_warm.read(text), keys=old_keys),
            ),
        ]
    # Interleaved: each round runs every case once, so a noisy neighbour slows all cases alike.
    runs: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(args.repeat):
        for name, fn in cases:
            runs[name].extend(timed(fn, 1))
    base_med = statistics.median(runs[cases[0][0]])
    base_best = min(runs[cases[0][0]])
    base_cpu = statistics.median(CPU[cases[0][1]])
    load_after = os.getloadavg()
    print(
        f"\n{'case':<52} {'median ms':>10} {'best ms':>9} {'x (median)':>11} {'x (best)':>9} {'x (CPU med)':>12}"
        f" {'samples/s (CPU med)':>20}"
    )
    figures: list[dict[str, object]] = []
    for name, fn in cases:
        med, best, cpu = statistics.median(runs[name]), min(runs[name]), statistics.median(CPU[fn])
        print(
            f"{name:<52} {med * 1e3:>10.1f} {best * 1e3:>9.1f} {base_med / med:>10.2f}x {base_best / best:>8.2f}x"
            f" {base_cpu / cpu:>11.2f}x {len(lines) / cpu:>20,.0f}"
        )
        figures.append(
            {
                "case": name,
                "median_ms": round(med * 1e3, 2),
                "best_ms": round(best * 1e3, 2),
                "cpu_median_ms": round(cpu * 1e3, 2),
                "speedup_median": round(base_med / med, 2),
                "speedup_best": round(base_best / best, 2),
                "speedup_cpu_median": round(base_cpu / cpu, 2),
                "samples_per_s_cpu_median": round(len(lines) / cpu),  # every sample line of the body, per CPU second
            }
        )
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} on {os.cpu_count()} CPUs")

    print(f"\n{'case':<52} {'peak MiB allocated during one ingest':>38}")
    for (name, fn), row in zip(cases, figures, strict=True):
        gc.collect()
        tracemalloc.start()
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del result
        row["peak_mib"] = round(peak / 2**20, 1)
        print(f"{name:<52} {peak / 2**20:>38.1f}")
    floor = floor_steps(text, args.repeat) if args.floor else None
    if floor is not None:
        print(f"\n{'bulk step over every sample line':<52} {'median CPU ms':>14}")
        for step, ms in floor.items():
            print(f"{step:<52} {ms:>14.2f}")
        print(f"{'a million samples per second allows':<52} {len(lines) / 1e3:>14.2f}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        doc = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "commit": commit.stdout.strip(),
            "extension_built": EXTENSION is not None,
            "series": len(lines),
            "repeat": args.repeat,
            "compare": args.compare,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "cases": figures,
        }
        if floor is not None:
            doc["floor_cpu_median_ms"] = floor
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
