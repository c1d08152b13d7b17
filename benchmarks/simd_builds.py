"""Decode speed of llama-server's native (AVX-512) build against its AVX2-only build, same model, alternating.

Both servers run at once (one compute thread each) and take turns: in each round each build serves the same
closed-loop load (one client, fixed prompt, ``--max-tokens`` per request, prompt cache off) for
``--phase-s`` seconds while the other idles; the order alternates between rounds. Reported: the server's own
decode rate (Σ predicted_n / Σ predicted_ms from ``timings``) per phase, and the AVX2/native ratio per round.

    python benchmarks/simd_builds.py --rounds 5 --phase-s 10

Needs both builds (scripts/build-llama-server.sh). Not a pass/fail test; the machine may be shared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.llamacpp_model import PRESETS, cached  # noqa: E402
from tests.llamacpp_server import LlamaServer, find_avx2_binary, find_binary, llama_server  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


def decode_rate(server: LlamaServer, seconds: float, max_tokens: int) -> float:
    n = ms = 0.0
    stop_at = time.perf_counter() + seconds
    with httpx.Client(headers={"Connection": "close"}) as c:
        while time.perf_counter() < stop_at:
            body = {"prompt": PROMPT, "n_predict": max_tokens, "cache_prompt": False}
            t = c.post(f"{server.url}/completion", json=body, timeout=120).json()["timings"]
            n += t["predicted_n"]
            ms += t["predicted_ms"]
    return n / (ms / 1e3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    args = parser.parse_args(argv)
    native_bin, avx2_bin = find_binary(), find_avx2_binary()
    if native_bin is None or avx2_bin is None:
        sys.exit("both builds are needed: scripts/build-llama-server.sh")
    work = Path(tempfile.mkdtemp(prefix="simd-builds-"))
    model = cached(work, PRESETS[args.preset])
    ratios = []
    with (
        llama_server(native_bin, model, work / "native.log", parallel=1) as native,
        llama_server(avx2_bin, model, work / "avx2.log", parallel=1) as avx2,
    ):
        for s in (native, avx2):
            decode_rate(s, 1.0, args.max_tokens)  # warm-up
        for r in range(args.rounds):
            order = [("native", native), ("avx2", avx2)]
            if r % 2:
                order.reverse()
            rates = {name: decode_rate(s, args.phase_s, args.max_tokens) for name, s in order}
            ratios.append(rates["avx2"] / rates["native"])
            print(
                f"round {r + 1}: native {rates['native']:.1f} tok/s, avx2 {rates['avx2']:.1f} tok/s, "
                f"avx2/native {ratios[-1]:.3f}",
                flush=True,
            )
    print(
        f"\navx2/native decode rate: median {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {args.rounds} rounds, model {args.preset}"
    )


if __name__ == "__main__":
    main()
