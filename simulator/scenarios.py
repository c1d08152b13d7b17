"""Fault scenarios: what each one changes, its parameters and their defaults.

A scenario is written ``NAME`` or ``NAME:key=value,key=value`` on the command line (``--scenario
page_cache_pressure:fraction=0.3``) and as ``{"name": ..., "params": {...}}`` on the control endpoint.

| scenario | effect | parameters (default) |
|---|---|---|
| simd_fallback | every engine step slower by ``factor`` (prefill and decode), no errors | factor (1.22) |
| page_cache_pressure | a ``fraction`` of requests stalls ``extra_s`` before prefill | fraction (0.2), extra_s (0.55) |
| hardware_mismatch | requests fail with HTTP 400, error type ``hardware_mismatch`` | — |
| stream_usage_only | stream chunks carry an empty delta text plus a usage object | — |
| debug_disabled | ``/debug/runtime_profile`` answers ``{}`` | — |
| hang | engines (or rank ``engine``) produce no tokens; arrivals queue; ``/health`` answers 200 | engine (-1: all) |
| error_burst | a ``rate`` of requests fails with HTTP ``status`` | rate (0.3), status (500) |
| prefix_cache_collapse | a ``fraction`` of requests has a cache-busting prefix: prefix hits collapse | fraction (1.0) |
| kv_saturation | ``fraction`` of KV blocks, at most ``blocks``, usable: queue, preempts | fraction (.05), blocks (64) |
| spec_decode_collapse | a draft position is accepted with probability ``acceptance`` (else 0.8) | acceptance (0.1) |
| lora_slot_exhaustion | the traffic names ``adapters`` distinct LoRA adapters (> ``--max-loras``) | adapters (8) |
| slow_kv_transfer | KV transfers of the P/D pair (``--kv-connector``) take ``factor`` times longer | factor (50) |
| frontend_delay | a ``fraction`` of requests waits ``extra_s`` before the queue | fraction (0.2), extra_s (0.4) |
| slow_rank | data-parallel engine ``engine`` steps ``factor`` times slower | engine (1), factor (3.0) |
| loop_block | the event loop blocks once for ``seconds``: nothing answers, /health included | seconds (30) |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULTS: dict[str, dict[str, float]] = {
    "simd_fallback": {"factor": 1.22},
    "page_cache_pressure": {"fraction": 0.2, "extra_s": 0.55},
    "hardware_mismatch": {},
    "stream_usage_only": {},
    "debug_disabled": {},
    "hang": {"engine": -1},
    "error_burst": {"rate": 0.3, "status": 500},
    "prefix_cache_collapse": {"fraction": 1.0},
    "kv_saturation": {"fraction": 0.05, "blocks": 64},
    "spec_decode_collapse": {"acceptance": 0.1},
    "lora_slot_exhaustion": {"adapters": 8},
    "slow_kv_transfer": {"factor": 50.0},
    "frontend_delay": {"fraction": 0.2, "extra_s": 0.4},
    "slow_rank": {"engine": 1, "factor": 3.0},
    "loop_block": {"seconds": 30.0},
}
_BOUNDS: dict[tuple[str, str], tuple[float, float]] = {
    ("simd_fallback", "factor"): (0.1, 100.0),
    ("page_cache_pressure", "fraction"): (0.0, 1.0),
    ("page_cache_pressure", "extra_s"): (0.0, 600.0),
    ("hang", "engine"): (-1, 255),
    ("error_burst", "rate"): (0.0, 1.0),
    ("error_burst", "status"): (500, 599),
    ("prefix_cache_collapse", "fraction"): (0.0, 1.0),
    ("kv_saturation", "fraction"): (0.001, 1.0),
    ("kv_saturation", "blocks"): (0, 10_000_000),
    ("spec_decode_collapse", "acceptance"): (0.0, 1.0),
    ("lora_slot_exhaustion", "adapters"): (1, 1024),
    ("slow_kv_transfer", "factor"): (1.0, 10000.0),
    ("frontend_delay", "fraction"): (0.0, 1.0),
    ("frontend_delay", "extra_s"): (0.0, 600.0),
    ("slow_rank", "engine"): (0, 255),
    ("slow_rank", "factor"): (0.1, 100.0),
    ("loop_block", "seconds"): (0.1, 600.0),
}


class ScenarioError(ValueError):
    """An unknown scenario or a bad parameter."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    params: Mapping[str, float] = field(default_factory=dict)

    def get(self, key: str) -> float:
        return float(self.params[key])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}


def make(name: str, params: Mapping[str, Any] | None = None) -> Scenario:
    """Validate ``name`` and ``params`` (filling defaults); raise ScenarioError with what is wrong."""
    if name not in DEFAULTS:
        raise ScenarioError(f"unknown scenario {name!r} (known: {', '.join(DEFAULTS)})")
    merged = dict(DEFAULTS[name])
    for key, raw in (params or {}).items():
        if key not in merged:
            known = ", ".join(merged) or "none"
            raise ScenarioError(f"scenario {name} has no parameter {key!r} (parameters: {known})")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ScenarioError(f"scenario {name}: {key} must be a number, got {raw!r}") from None
        lo, hi = _BOUNDS.get((name, key), (float("-inf"), float("inf")))
        if not lo <= value <= hi:
            raise ScenarioError(f"scenario {name}: {key}={value} outside [{lo}, {hi}]")
        merged[key] = value
    return Scenario(name, merged)


def parse(spec: str) -> Scenario:
    """``NAME`` or ``NAME:key=value,key=value``."""
    name, _, rest = spec.strip().partition(":")
    params: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ScenarioError(f"scenario parameter {part!r} must be key=value")
        params[key.strip()] = value.strip()
    return make(name.strip(), params)


class ScenarioSet:
    """The scenarios active now; read on the hot path, replaced as a whole by the control endpoint."""

    def __init__(self, scenarios: Iterable[Scenario] = ()) -> None:
        self._active: dict[str, Scenario] = {}
        self.version = 0
        self.replace(scenarios)

    def replace(self, scenarios: Iterable[Scenario]) -> None:
        self._active = {s.name: s for s in scenarios}
        self.version += 1

    def enable(self, scenario: Scenario) -> None:
        self._active = {**self._active, scenario.name: scenario}
        self.version += 1

    def disable(self, name: str) -> None:
        if name not in DEFAULTS:
            raise ScenarioError(f"unknown scenario {name!r} (known: {', '.join(DEFAULTS)})")
        self._active = {k: v for k, v in self._active.items() if k != name}
        self.version += 1

    def get(self, name: str) -> Scenario | None:
        return self._active.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._active

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self._active.values()]
