"""The price table: what a machine type costs per hour, as the user pays it (deploy/prices.example.yml).

File format (YAML)::

    currency: USD          # a 3-letter code; carried as a label, never converted
    example: true          # optional: the values are placeholders (the CLI warns while this is set)
    machine_types:         # machine type (DMI product_name: the cloud instance type) -> price per hour
      p5.48xlarge: 55.04
      c7g.16xlarge: 2.32

The price is per machine (one node, the unit inferwatch_node_info counts) per hour, in ``currency``: on-demand,
reserved or spot, whatever the user pays; inferwatch ships no prices of its own.

Two consumers: ``inferwatch matrix --prices FILE`` (agent.matrix's effective cost) and the recording rules that
``inferwatch prices FILE --rules`` writes for the fleet's Prometheus (one constant series per machine type,
``machine_type:inferwatch_price_per_hour:config``), which the matrix dashboard joins on ``machine_type``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from agent.errors import ConfigError

PRICE_RECORD = "machine_type:inferwatch_price_per_hour:config"
PRICE_RULE_GROUP = "inferwatch-prices"
MAX_PRICE_FILE_BYTES = 1 << 20
MAX_MACHINE_TYPES = 10_000
_CURRENCY = re.compile(r"^[A-Z]{3}$")
# Machine types are DMI product names: letters, digits and a few separators; no quotes (they become labels).
_MACHINE_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/ ()+-]{0,127}$")


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Price per hour of one machine of each type, in ``currency``. ``example``: placeholder values."""

    currency: str
    per_hour: Mapping[str, float]
    example: bool = False

    def price(self, machine_type: str) -> float | None:
        return self.per_hour.get(machine_type)


def parse_prices(text: str, source: str = "price file") -> PriceTable:
    """Validate a price file's text; raise ConfigError naming the field on anything else."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with currency and machine_types")
    unknown = sorted(set(data) - {"currency", "machine_types", "example"})
    if unknown:
        fields = ", ".join(map(str, unknown))
        raise ConfigError(f"{source}: unknown field(s) {fields} (known: currency, machine_types, example)")
    currency = data.get("currency")
    if not isinstance(currency, str) or not _CURRENCY.match(currency):
        raise ConfigError(f"{source}: currency must be a 3-letter code such as USD (got {currency!r})")
    example = data.get("example", False)
    if not isinstance(example, bool):
        raise ConfigError(f"{source}: example must be true or false (got {example!r})")
    table = data.get("machine_types")
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{source}: machine_types must map machine types to a price per hour")
    if len(table) > MAX_MACHINE_TYPES:
        raise ConfigError(f"{source}: machine_types holds {len(table)} entries (at most {MAX_MACHINE_TYPES})")
    out: dict[str, float] = {}
    for name, price in table.items():
        if not isinstance(name, str) or not _MACHINE_TYPE.match(name):
            raise ConfigError(f"{source}: machine_types: {name!r} is not a machine type name")
        if isinstance(price, bool) or not isinstance(price, (int, float)):
            raise ConfigError(f"{source}: machine_types.{name}: price per hour must be a number (got {price!r})")
        if not math.isfinite(price) or price <= 0:
            raise ConfigError(f"{source}: machine_types.{name}: price per hour must be > 0 (got {price!r})")
        out[name] = float(price)
    return PriceTable(currency, out, example)


def load_prices(path: Path) -> PriceTable:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PRICE_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"price file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PRICE_FILE_BYTES:
        raise ConfigError(f"price file {path}: larger than {MAX_PRICE_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"price file {path}: not UTF-8") from None
    return parse_prices(text, f"price file {path}")


def price_rules(table: PriceTable, source: str = "") -> str:
    """A Prometheus rule file with one constant series per machine type: value = price per hour, labels
    machine_type and currency. Load it beside alerts/*.rules.yml; the matrix dashboard reads it."""
    rules = [
        {
            "record": PRICE_RECORD,
            "expr": f"vector({price!r})",
            "labels": {"machine_type": name, "currency": table.currency},
        }
        for name, price in sorted(table.per_hour.items())
    ]
    head = (
        "# Generated by `inferwatch prices"
        + (f" {source}" if source else "")
        + " --rules`: edit the price file and regenerate, not this file.\n"
        "# One series per machine type, value = price per hour of one machine"
        + (" (EXAMPLE placeholder values)" if table.example else "")
        + ".\n"
    )
    return head + yaml.safe_dump({"groups": [{"name": PRICE_RULE_GROUP, "rules": rules}]}, sort_keys=False)
