"""The worked example of docs/matrix.md ("Effective cost"): the simulator's hardware profiles through the same
cost arithmetic as ``inferwatch matrix --prices`` (inferwatch.agent.fleet.matrix.cost_rows), with
deploy/prices.example.yml's PLACEHOLDER prices.

Throughput per node: Llama-3.1-8B decoding a steady batch of BATCH sequences with CONTEXT_TOKENS of context each,
one engine per GPU (or per CPU socket), from the simulator's roofline (simulator/timing.py without its noise:
``overhead + max(compute, memory)`` per step, BATCH tokens per step). The Graviton3 node without SVE runs every
step ``simd_fallback``'s default factor slower (simulator/scenarios.py). Prints the markdown table in the docs.

    .venv/bin/python -m benchmarks.matrix_cost_example
"""

from __future__ import annotations

from pathlib import Path

from inferwatch.agent.fleet.matrix import Cell, Hardware, Matrix, cost_rows, cost_to_markdown
from inferwatch.agent.fleet.prices import load_prices
from inferwatch.simulator.profiles import deploy
from inferwatch.simulator.scenarios import DEFAULTS

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BATCH = 32
CONTEXT_TOKENS = 1024
ROOT = Path(__file__).resolve().parents[1]

# (machine type, CPU label, GPU label, simulator profile, engines per node, step slow-down). The labels name the
# simulator profile and the engine count; they claim nothing about what those instance types carry.
NODES = (
    ("p5.48xlarge", "sim", "8 x h100", "h100", 8, 1.0),
    ("p4d.24xlarge", "sim", "8 x a100", "a100", 8, 1.0),
    ("g6e.2xlarge", "sim", "1 x l40s", "l40s", 1, 1.0),
    ("m7i.48xlarge", "sim: 2 x sapphirerapids-cpu", "none", "sapphirerapids-cpu", 2, 1.0),
    ("c7g.16xlarge", "sim: graviton3-cpu", "none", "graviton3-cpu", 1, 1.0),
    ("c7g.16xlarge", "sim: graviton3-cpu, SVE off", "none", "graviton3-cpu", 1, DEFAULTS["simd_fallback"]["factor"]),
)


def engine_tokens_per_second(profile: str, slow_down: float) -> float:
    dep = deploy(MODEL, profile)
    hw = dep.hardware
    compute = 2 * dep.size.params * BATCH / (hw.peak_flops * hw.compute_efficiency)
    memory = (dep.weight_bytes + dep.size.kv_bytes_per_token() * BATCH * CONTEXT_TOKENS) / (
        hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency
    )
    step_s = (hw.step_overhead_s + max(compute, memory)) * slow_down
    return BATCH / step_s


def main() -> None:
    cells = {}
    for machine, cpu, gpu, profile, engines, slow in NODES:
        tps = engines * engine_tokens_per_second(profile, slow)
        cells[(MODEL, Hardware(machine, cpu, gpu))] = Cell(None, tps, 1)
    hardware = tuple(h for _, h in cells)
    m = Matrix("simulated", (MODEL,), hardware, cells)
    prices = load_prices(ROOT / "deploy" / "prices.example.yml")
    print(cost_to_markdown(cost_rows(m, prices), prices.currency), end="")


if __name__ == "__main__":
    main()
