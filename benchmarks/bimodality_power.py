"""Measured power and false-positive rate of the bimodality detector (agent/node/analytics/bimodality.py).

Every trial draws n latencies, inserts them into the agent's DDSketch (as the receiver does) and runs
the detector on the sketch's bins, exactly the production path.

- Power: a 380 ms / 850 ms mixture, each mode lognormal with spread sigma (log units; 0.15 ≈ 15 % CV),
  for a grid of sigma and slow-mode fractions. Issue target: >= 95 % flagged at n = 500 with >= 20 % slow.
- False positives: unimodal shapes. Issue target: lognormals with sigma up to 0.6 flagged in <= 5 %.
  Skewed and flat-topped shapes (gamma, Weibull, exponential, shifted lognormal, uniform) are
  measured too, at n = 500 and n = 5000.
- Baseline, same trials: "ΔBIC > 0 alone" (a plain two-component BIC test, no separation or dip
  condition), to show what each extra condition buys.

Rates carry a 95 % Wilson interval. Run: ``.venv/bin/python benchmarks/bimodality_power.py
[--trials 500] [--n 500]`` (a few minutes on one core).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferwatch.agent.node.analytics import bimodality
from inferwatch.agent.node.analytics.windows import log_bins, new_sketch

Gen = Callable[[random.Random], float]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def rates(gen: Gen, n: int, trials: int, seed: int) -> tuple[int, int, float]:
    """(flagged by the detector, flagged by ΔBIC > 0 alone, mean ms per fit)."""
    rng = random.Random(seed)
    flagged = bic_only = 0
    spent = 0.0
    for _ in range(trials):
        sketch = new_sketch()
        for _ in range(n):
            sketch.add(gen(rng))
        t0 = time.perf_counter()
        res = bimodality.detect_log(log_bins(sketch))
        spent += time.perf_counter() - t0
        assert res is not None
        flagged += res.bimodal
        bic_only += res.delta_bic > 0
    return flagged, bic_only, spent / trials * 1e3


def mixture(sigma: float, slow: float) -> Gen:
    fast_mu, slow_mu = math.log(0.380), math.log(0.850)
    return lambda r: r.lognormvariate(slow_mu if r.random() < slow else fast_mu, sigma)


def lognormal(sigma: float) -> Gen:
    return lambda r: r.lognormvariate(math.log(0.38), sigma)


UNIMODAL: dict[str, Gen] = {
    **{f"lognormal sigma={s}": lognormal(s) for s in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)},
    "gamma k=2 (mean 0.4 s)": lambda r: r.gammavariate(2.0, 0.2),
    "Weibull k=1.5": lambda r: r.weibullvariate(0.4, 1.5),
    "exponential (mean 0.33 s)": lambda r: r.expovariate(3.0),
    "0.2 s + lognormal(0.2 s, 0.6)": lambda r: 0.2 + r.lognormvariate(math.log(0.2), 0.6),
    "uniform 0.30–0.40 s": lambda r: r.uniform(0.30, 0.40),
    "uniform 0.1–1.0 s": lambda r: r.uniform(0.1, 1.0),
}


def pct(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{100 * k / n:5.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--large-n", type=int, default=5000)
    args = ap.parse_args()
    t_start = time.monotonic()
    print(f"## Power: 380 ms / 850 ms lognormal modes, n = {args.n}, {args.trials} trials per cell\n")
    fractions = (0.05, 0.10, 0.20, 0.30, 0.50)
    print("| mode sigma | " + " | ".join(f"slow {int(f * 100)} %" for f in fractions) + " |")
    print("|---|" + "---|" * len(fractions))
    for sigma in (0.10, 0.15, 0.20, 0.25, 0.30):
        cells = []
        for j, frac in enumerate(fractions):
            k, _, _ = rates(mixture(sigma, frac), args.n, args.trials, seed=1000 + j + int(sigma * 100))
            cells.append(pct(k, args.trials))
        print(f"| {sigma:.2f} | " + " | ".join(cells) + " |")
    for n in (args.n, args.large_n):
        trials = args.trials if n == args.n else max(args.trials // 5, 50)
        print(f"\n## False positives on unimodal shapes, n = {n}, {trials} trials each\n")
        print("| distribution | detector flags | baseline ΔBIC > 0 alone flags | ms per fit |")
        print("|---|---|---|---|")
        for i, (name, gen) in enumerate(UNIMODAL.items()):
            k, kb, ms = rates(gen, n, trials, seed=2000 + i + n)
            print(f"| {name} | {pct(k, trials)} | {pct(kb, trials)} | {ms:.1f} |")
    print(f"\n(total {time.monotonic() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
