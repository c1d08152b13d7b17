"""The exposition reader against the public conformance cases in tests/fixtures/expfmt/.

Each case's outcome comes from the reference parsers (manifest.json, written by vendor.py):
a valid case is read to exactly the reference's samples (names, labels in order, values; NaN
matches NaN), an invalid one raises ExpositionError (a SourceFormatError) with a line number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from inferwatch.agent.errors import SourceFormatError
from inferwatch.agent.node.engine.exposition import Everything, ExpositionReader
from inferwatch.agent.node.engine.textformat import ExpositionError, decode

HERE = Path(__file__).parent / "fixtures" / "expfmt"
CASES = json.loads((HERE / "manifest.json").read_text())["cases"]


def _read(case: dict) -> list[list[object]]:
    text = decode((HERE / case["file"]).read_bytes())
    expo = ExpositionReader(("",), Everything(), scrape_rules=False).read(
        text, openmetrics=case["format"] == "openmetrics"
    )
    return [
        [name, [list(kv) for kv in labels], value] for name, series in expo.samples.items() for labels, value in series
    ]


def _same(value: float, expected: str) -> bool:
    want = float(expected)
    return (math.isnan(value) and math.isnan(want)) or value == want


@pytest.mark.parametrize("case", [c for c in CASES if c["valid"]], ids=lambda c: c["id"])
def test_valid_case_reads_as_the_reference(case: dict) -> None:
    got = _read(case)
    want = case["samples"]
    assert sorted(map(str, [g[:2] for g in got])) == sorted(map(str, [w[:2] for w in want]))
    # Same samples in the same order per name, values equal (NaN = NaN).
    by_name: dict[str, list] = {}
    for name, labels, value in want:
        by_name.setdefault(name, []).append((labels, value))
    for name, labels, value in got:
        exp_labels, exp_value = by_name[name].pop(0)
        assert labels == exp_labels, (name, labels, exp_labels)
        assert _same(value, exp_value), (name, labels, value, exp_value)


@pytest.mark.parametrize("case", [c for c in CASES if not c["valid"]], ids=lambda c: c["id"])
def test_invalid_case_is_rejected_with_a_line_number(case: dict) -> None:
    with pytest.raises(SourceFormatError) as info:
        _read(case)
    assert isinstance(info.value, ExpositionError), info.value
    assert info.value.lineno >= 1
    assert f"line {info.value.lineno}" in str(info.value)


def test_corpus_is_the_whole_vendored_set() -> None:
    files = {p.relative_to(HERE).as_posix() for p in HERE.glob("*/*.txt")}
    assert files == {c["file"] for c in CASES}
    assert len(CASES) >= 300
