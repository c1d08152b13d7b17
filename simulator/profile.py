"""The runtime debug profile (``GET /debug/runtime_profile``).

Answered in full only when the simulator was started with ``--debug-profile`` (debug mode cannot be
switched on later — the pitfall) AND the request carries the debug header (default
``X-Runtime-Debug: runtime_profile=1``) AND the ``debug_disabled`` scenario is off; otherwise ``{}``.
The profile reflects the active scenarios (SIMD fallback, compiled-for hardware). Like real debug
dumps it includes the launch environment — with a fake ``HF_TOKEN`` so redaction can be tested.
"""

from __future__ import annotations

import os
import time
from typing import Any

from inferwatch.simulator.config import ENGINE_VERSION, SimConfig
from inferwatch.simulator.profiles import GIB, Deployment
from inferwatch.simulator.scenarios import ScenarioSet

FAKE_HF_TOKEN = "hf_SIMULATEDsecretNOTREAL0000000000"
MISMATCHED_TARGET = {"gpu": "10.0", "cpu": "aarch64-sve2"}


def cpu_affinity_mask() -> str:
    """This process's CPU affinity as a hex mask (``taskset -p`` style)."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    return hex(sum(1 << c for c in cpus))


def runtime_profile(config: SimConfig, dep: Deployment, scenarios: ScenarioSet, started_at: float) -> dict[str, Any]:
    hw = dep.hardware
    simd_fallback = "simd_fallback" in scenarios
    mismatch = "hardware_mismatch" in scenarios
    reserved = hw.memory_bytes * dep.gpu_memory_utilization if hw.kind == "gpu" else 0
    native_target = (
        hw.compute_capability
        if hw.kind == "gpu"
        else ("x86_64-amx" if "amx_bf16" in hw.simd_features else "aarch64-sve")
    )
    profile: dict[str, Any] = {
        "engine": "vllm",
        "engine_version": ENGINE_VERSION,
        "simulated": True,
        "model": dep.model,
        "served_model_name": dep.model,
        "hardware_profile": hw.name,
        "device_kind": hw.kind,
        "device_name": hw.name if hw.kind == "cpu" else hw.device_name,
        "quantization_scheme": dep.quantization,
        "kv_cache_dtype": "auto",
        "attention_kernel": hw.attention_kernel,
        "tensor_parallel_size": dep.tensor_parallel_size,
        "data_parallel_size": config.engines,
        "max_num_seqs": dep.seqs,
        "max_num_batched_tokens": dep.batched_tokens,
        "max_model_len": dep.size.max_model_len,
        "block_size": dep.block_size,
        "num_gpu_blocks": dep.num_gpu_blocks,
        "model_weights_bytes": int(dep.weight_bytes),
        "gpu_memory_total_bytes": hw.memory_bytes if hw.kind == "gpu" else 0,
        "gpu_memory_used_bytes": int(reserved),
        "host_memory_used_bytes": int(dep.weight_bytes + GIB) if hw.kind == "cpu" else GIB,
        "cpu_affinity_mask": cpu_affinity_mask(),
        "cpu_count": os.cpu_count() or 0,
        "compiled_for": MISMATCHED_TARGET[hw.kind] if mismatch else native_target,
        "running_on": native_target,
        "simd_features_compiled": list(hw.simd_features),
        "simd_features_active": list(hw.simd_fallback_features if simd_fallback else hw.simd_features),
        "simd_fallback": simd_fallback,
        "cuda_graphs": hw.kind == "gpu",
        "pid": os.getpid(),
        "uptime_seconds": round(time.time() - started_at, 3),
        "environment": {
            "VLLM_ATTENTION_BACKEND": hw.attention_kernel,
            "VLLM_TARGET_DEVICE": "cuda" if hw.kind == "gpu" else "cpu",
            "HF_TOKEN": FAKE_HF_TOKEN,
        },
    }
    return profile
