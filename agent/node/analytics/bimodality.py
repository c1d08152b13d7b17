"""Is a latency distribution bimodal? A two-component Gaussian mixture on log latency.

Latency is positive and right-skewed; in log space a lognormal latency is exactly Gaussian, so a
unimodal lognormal of any median and spread is the null model, and the test is scale-free. The
detector fits one Gaussian and a two-component mixture (EM, started from the best two-group split of
the sorted values) to the log latencies and calls the distribution bimodal when all of these hold:

1. the mixture is supported by the data: ΔBIC = 2·(ℓ₂ − ℓ₁) − 3·ln n > 0 (three extra parameters);
2. the smaller component holds at least :data:`MIN_WEIGHT` of the requests;
3. the data themselves dip between the two modes: with h half the narrower component's σ, the requests
   within ±h of the fitted density's valley (c_v) are significantly fewer than those within ±h of the
   emptier mode (c_p): c_p − c_v ≥ :data:`DIP_Z`·√(c_p + c_v) (counts are Poisson-like). A
   flat-topped unimodal shape (a uniform) is fit well by two Gaussians with a valley the data do not
   have; this check rejects it;
4. the components are separated: Ashman's D = √2·|μ₁ − μ₂| / √(σ₁² + σ₂²) ≥ :data:`D_THRESHOLD` (2,
   the usual criterion for a clean separation; with D < 2 the mixture density may have one peak).

The exported statistic is Ashman's D when 1–3 hold, else 0, so ``bimodality >= 2`` is the verdict.
Its measured power and false-positive rate are in docs/analytics.md (benchmarks/bimodality_power.py).

The input is weighted points (log value, count): the bins of a DDSketch, so the detector runs on the
windowed sketch itself, never on kept raw values (zeros, i.e. values below 1 µs, are left out). Pure
Python: a fit (at most 200 points) takes 1–13 ms, and the agent keeps a verdict while its window's input stays
materially the same (agent/node/analytics/latency.py, ``REFIT_SHAPE``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

D_THRESHOLD = 2.0
MIN_WEIGHT = 0.05
DIP_Z = 2.0
MIN_SAMPLES = 50  # below this no verdict: absent, never a guess
MAX_ITERATIONS = 100
TOLERANCE = 1e-6  # relative change of the log-likelihood that ends EM
MAX_POINTS = 200  # wider inputs are re-binned to this many equal-width bins (cost is linear in points)
VARIANCE_FLOOR = 1e-6  # (log units)²: 0.1 % spread; keeps a one-bin component finite
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True, slots=True)
class Bimodality:
    """The verdict and the fitted mixture. Modes are medians of each component, in the input's unit."""

    n: float
    bimodal: bool
    statistic: float  # Ashman's D when conditions 1–3 hold (ΔBIC > 0, minor weight, dip), else 0
    delta_bic: float
    ashman_d: float
    weight_slow: float  # weight of the component with the larger median
    valley_ratio: float  # c_v / c_p of condition 3 (requests near the valley / near the emptier mode)
    dip_z: float  # (c_p − c_v) / √(c_p + c_v)
    mode_fast: float
    mode_slow: float


def _loglik(points: Sequence[tuple[float, float]], comps: list[tuple[float, float, float]]) -> float:
    total = 0.0
    for x, w in points:
        dens = 0.0
        for weight, mu, var in comps:
            dens += weight * math.exp(-0.5 * (x - mu) ** 2 / var) / math.sqrt(var)
        total += w * (math.log(dens) if dens > 0 else -745.0)
    return total - _LOG_SQRT_2PI * sum(w for _, w in points)


def _best_split(points: Sequence[tuple[float, float]]) -> int:
    """Index k such that points[:k] / points[k:] maximise the between-group sum of squares (Otsu)."""
    total_w = sum(w for _, w in points)
    total_s = sum(x * w for x, w in points)
    best_k, best = 1, -1.0
    cw = cs = 0.0
    for k in range(1, len(points)):
        x, w = points[k - 1]
        cw += w
        cs += x * w
        rw = total_w - cw
        if cw <= 0 or rw <= 0:
            continue
        diff = cs / cw - (total_s - cs) / rw
        between = cw * rw * diff * diff
        if between > best:
            best, best_k = between, k
    return best_k


def _moments(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    w = sum(p[1] for p in points)
    mu = sum(x * c for x, c in points) / w
    var = sum(c * (x - mu) ** 2 for x, c in points) / w
    return w, mu, max(var, VARIANCE_FLOOR)


def _em(
    points: Sequence[tuple[float, float]], comps: list[tuple[float, float, float]]
) -> list[tuple[float, float, float]]:
    n = sum(w for _, w in points)
    prev = -math.inf
    exp, sqrt, log = math.exp, math.sqrt, math.log
    # The sums over all points do not change between iterations: summed once (in the same order as per iteration)
    s_x = s_xx = 0.0
    for x, w in points:
        s_x += w * x
        s_xx += w * x * x
    for _ in range(MAX_ITERATIONS):
        (a1, m1, v1), (a2, m2, v2) = comps
        c1, c2 = a1 / sqrt(v1), a2 / sqrt(v2)
        h1, h2 = -0.5 / v1, -0.5 / v2
        s_r = s_rx = s_rxx = 0.0
        ll = 0.0
        for x, w in points:
            d1 = x - m1
            d2 = x - m2
            p1 = c1 * exp(h1 * d1 * d1)
            tot = p1 + c2 * exp(h2 * d2 * d2)
            if tot <= 0.0:  # far from both: give it to the nearer component
                rw = w if abs(d1) <= abs(d2) else 0.0
                ll += w * -745.0
            else:
                rw = p1 / tot * w
                ll += w * log(tot)
            rwx = rw * x
            s_r += rw
            s_rx += rwx
            s_rxx += rwx * x
        if s_r <= 0 or s_r >= n:
            break
        w2 = n - s_r
        m1n, m2n = s_rx / s_r, (s_x - s_rx) / w2
        v1n = max(s_rxx / s_r - m1n * m1n, VARIANCE_FLOOR)
        v2n = max((s_xx - s_rxx) / w2 - m2n * m2n, VARIANCE_FLOOR)
        comps = [(s_r / n, m1n, v1n), (w2 / n, m2n, v2n)]
        if abs(ll - prev) <= TOLERANCE * abs(ll) + 1e-12:
            break
        prev = ll
    return comps


def _mass_near(pts: Sequence[tuple[float, float]], xs: list[float], center: float, h: float) -> float:
    lo = bisect.bisect_left(xs, center - h)
    hi = bisect.bisect_right(xs, center + h)
    return sum(w for _, w in pts[lo:hi])


def _valley_and_peak(
    pts: Sequence[tuple[float, float]], fast: tuple[float, float, float], slow: tuple[float, float, float]
) -> tuple[float, float]:
    """Empirical mass near the fitted density's lowest point between the modes, and near the emptier mode."""
    comps = [fast, slow]

    def density(x: float) -> float:
        return sum(a * math.exp(-0.5 * (x - m) ** 2 / v) / math.sqrt(v) for a, m, v in comps)

    lo, hi = fast[1], slow[1]
    grid = [lo + (hi - lo) * i / 64 for i in range(1, 64)]
    valley = min(grid, key=density) if grid and hi > lo else lo
    h = max(0.5 * math.sqrt(min(fast[2], slow[2])), 0.01)
    xs = [x for x, _ in pts]
    peak = min(_mass_near(pts, xs, fast[1], h), _mass_near(pts, xs, slow[1], h))
    near = _mass_near(pts, xs, valley, h)
    return near, peak


def _rebin(pts: list[tuple[float, float]], bins: int) -> list[tuple[float, float]]:
    """At most ``bins`` points: equal-width bins over the range, each at its weighted mean."""
    lo, hi = pts[0][0], pts[-1][0]
    width = (hi - lo) / bins
    acc: dict[int, list[float]] = {}
    for x, w in pts:
        slot = acc.setdefault(min(int((x - lo) / width), bins - 1), [0.0, 0.0])
        slot[0] += x * w
        slot[1] += w
    return [(sx / sw, sw) for _, (sx, sw) in sorted(acc.items())]


def detect_log(points: Iterable[tuple[float, float]]) -> Bimodality | None:
    """Run the test on weighted points (log latency, count); ``None`` below :data:`MIN_SAMPLES`."""
    pts = sorted((x, w) for x, w in points if w > 0 and math.isfinite(x))
    if len(pts) > MAX_POINTS:
        pts = _rebin(pts, MAX_POINTS)
    n = sum(w for _, w in pts)
    if n < MIN_SAMPLES:
        return None
    _, mu, var = _moments(pts)
    ll1 = _loglik(pts, [(1.0, mu, var)])
    if len(pts) < 2:
        m = math.exp(mu)
        return Bimodality(n, False, 0.0, -math.inf, 0.0, 0.0, math.inf, 0.0, m, m)
    k = _best_split(pts)
    wa, ma, va = _moments(pts[:k])
    wb, mb, vb = _moments(pts[k:])
    comps = _em(pts, [(wa / n, ma, va), (wb / n, mb, vb)])
    ll2 = _loglik(pts, comps)
    delta_bic = 2.0 * (ll2 - ll1) - 3.0 * math.log(n)
    fast, slow = sorted(comps, key=lambda c: c[1])
    d = math.sqrt(2.0) * abs(slow[1] - fast[1]) / math.sqrt(fast[2] + slow[2])
    c_v, c_p = _valley_and_peak(pts, fast, slow)
    dip_z = (c_p - c_v) / math.sqrt(c_p + c_v) if c_p + c_v > 0 else 0.0
    holds = delta_bic > 0 and min(fast[0], slow[0]) >= MIN_WEIGHT and dip_z >= DIP_Z  # as supported()
    statistic = d if holds else 0.0
    return Bimodality(
        n=n,
        bimodal=statistic >= D_THRESHOLD,
        statistic=statistic,
        delta_bic=delta_bic,
        ashman_d=d,
        weight_slow=slow[0],
        valley_ratio=c_v / c_p if c_p > 0 else math.inf,
        dip_z=dip_z,
        mode_fast=math.exp(fast[1]),
        mode_slow=math.exp(slow[1]),
    )


def supported(b: Bimodality) -> bool:
    """Conditions 1–3 (the statistic is Ashman's D, not 0)."""
    return b.delta_bic > 0 and min(b.weight_slow, 1.0 - b.weight_slow) >= MIN_WEIGHT and b.dip_z >= DIP_Z


def rescaled(b: Bimodality, n: float) -> Bimodality:
    """The verdict the test gives on the same distribution holding ``n`` requests instead of ``b.n``.

    Exact for the same normalised bins with every count scaled by k = n / b.n: EM, the starting split and the rebinning
    depend on the weights' ratios only, so the fitted mixture (weights, modes, σ, Ashman's D, the valley) is the
    same; both log-likelihoods scale by k, so ΔBIC = (ΔBIC₀ + 3·ln n₀)·k − 3·ln n; the dip's counts scale by k, so its
    z by √k. ``None``-free: below :data:`MIN_SAMPLES` the test itself answers ``None``, which the caller must ask it.
    """
    k = n / b.n
    delta_bic = (b.delta_bic + 3.0 * math.log(b.n)) * k - 3.0 * math.log(n)
    out = replace(b, n=n, delta_bic=delta_bic, dip_z=b.dip_z * math.sqrt(k))
    statistic = out.ashman_d if supported(out) else 0.0
    return replace(out, statistic=statistic, bimodal=statistic >= D_THRESHOLD)


def detect(values: Iterable[float]) -> Bimodality | None:
    """Run the test on raw positive latencies (non-positive values are left out)."""
    return detect_log((math.log(v), 1.0) for v in values if v > 0)
