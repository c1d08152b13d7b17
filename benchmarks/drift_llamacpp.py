"""Output drift between llama.cpp builds (docs/matrix.md, "Output drift"): the native build (AVX-512 on an AVX-512
host) and the AVX2-only build (scripts/build-llama-server.sh --avx2-only) serving the same generated GGUF model
(tests/llamacpp_model.py), through ``inferwatch drift`` with its built-in prompt set, greedy decoding and top-5
log-probabilities. A second native server is the control: the same build twice must agree bit for bit.

    .venv/bin/python benchmarks/drift_llamacpp.py [--max-tokens 128] [--presets tiny small] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's tests/ helpers, run as a script too
from tests.conftest import PYTHON, ROOT
from tests.llamacpp_model import PRESETS, cached
from tests.llamacpp_server import find_avx2_binary, find_binary, llama_server


def measure(preset: str, max_tokens: int, tmp: Path) -> dict[str, Any]:
    native, avx2 = find_binary(), find_avx2_binary()
    if native is None or avx2 is None:
        raise SystemExit("build both servers first: scripts/build-llama-server.sh [--avx2-only DIR]")
    model = cached(tmp, PRESETS[preset])
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(llama_server(native, model, tmp / f"{preset}-a.log", parallel=1))
        b = stack.enter_context(llama_server(native, model, tmp / f"{preset}-b.log", parallel=1))
        c = stack.enter_context(llama_server(avx2, model, tmp / f"{preset}-c.log", parallel=1))
        cmd = [PYTHON, "-m", "inferwatch.agent", "drift", "--format", "json", "--max-tokens", str(max_tokens)]
        cmd += ["--endpoint", f"native={a.url}", "--endpoint", f"native-again={b.url}", "--endpoint", f"avx2={c.url}"]
        started = time.monotonic()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
        if r.returncode not in (0, 1):
            raise SystemExit(r.stderr)
    out: dict[str, Any] = {"preset": preset, "wall_s": round(time.monotonic() - started, 1)}
    for rep in json.loads(r.stdout):
        ps = rep["prompts"]
        out[rep["candidate"]] = {
            "prompts": len(ps),
            "tokens_per_prompt": max_tokens,
            "diverged_prompts": rep["diverged_prompts"],
            "first_divergence": sorted(p["diverged_at"] for p in ps if p["diverged_at"] is not None),
            "max_abs_logprob_delta": max(p["max_abs_logprob_delta"] for p in ps),
            "mean_abs_logprob_delta": sum(p["mean_abs_logprob_delta"] for p in ps) / len(ps),
            "flagged": rep["flagged"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(PRESETS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "drift_llamacpp.json")
    args = ap.parse_args(argv)
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln), ""
    )
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(p, args.max_tokens, Path(tmp)) for p in args.presets]
    doc = {"what": "inferwatch drift, native vs AVX2-only llama-server", "cpu": cpu, "machine": platform.machine(),
           "avx512f": "avx512f" in Path("/proc/cpuinfo").read_text(), "results": results}  # fmt: skip
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    json.dump(doc, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
