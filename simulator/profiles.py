"""Hardware profiles and model sizes: the parameters behind the simulator's timing model.

A step of the engine costs ``overhead + max(compute, memory)`` (a roofline): compute is
``2 × params × tokens / (peak_flops × efficiency)``, memory is ``(weight bytes + KV bytes read) /
(bandwidth × efficiency)``. Figures are public datasheet peaks (dense bf16 FLOP/s, memory bandwidth)
with efficiencies chosen so that an 8B model lands where published measurements put it (H100: TTFT
tens of ms, ITL 6–15 ms; a Sapphire Rapids socket with AMX: TTFT ~0.3 s for 256 prompt tokens).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One accelerator (or CPU socket) as the timing model sees it."""

    name: str
    kind: str  # "gpu" | "cpu"
    device_name: str
    peak_flops: float  # dense bf16 FLOP/s
    mem_bandwidth_bytes_s: float
    memory_bytes: int
    compute_efficiency: float  # achieved fraction of peak FLOP/s in prefill
    bandwidth_efficiency: float  # achieved fraction of peak bandwidth in decode
    step_overhead_s: float  # scheduler, kernel launch, sampling per engine step
    frontend_overhead_s: float  # API server + tokenisation before the engine sees a request
    noise_sigma: float  # lognormal sigma of the per-step jitter
    max_num_seqs: int
    max_num_batched_tokens: int
    default_quantization: str
    attention_kernel: str
    simd_features: tuple[str, ...] = ()
    simd_fallback_features: tuple[str, ...] = ()
    compute_capability: str = ""


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile(
            "h100",
            "gpu",
            "NVIDIA H100 80GB HBM3",
            989e12,
            3.35e12,
            80 * GIB,
            0.45,
            0.70,
            0.003,
            0.004,
            0.06,
            256,
            8192,
            "bf16",
            "FLASH_ATTN",
            compute_capability="9.0",
        ),
        HardwareProfile(
            "a100",
            "gpu",
            "NVIDIA A100-SXM4-80GB",
            312e12,
            2.039e12,
            80 * GIB,
            0.50,
            0.70,
            0.004,
            0.004,
            0.06,
            256,
            8192,
            "bf16",
            "FLASH_ATTN",
            compute_capability="8.0",
        ),
        HardwareProfile(
            "l40s",
            "gpu",
            "NVIDIA L40S",
            362e12,
            0.864e12,
            48 * GIB,
            0.45,
            0.70,
            0.004,
            0.004,
            0.07,
            128,
            2048,
            "fp8",
            "FLASHINFER",
            compute_capability="8.9",
        ),
        HardwareProfile(
            "graviton3-cpu",
            "cpu",
            "AWS Graviton3 (Neoverse V1, 64 vCPU)",
            6e12,
            307e9,
            128 * GIB,
            0.40,
            0.60,
            0.010,
            0.006,
            0.10,
            16,
            2048,
            "bf16",
            "TORCH_SDPA",
            simd_features=("asimd", "asimddp", "sve", "svebf16", "i8mm", "bf16"),
            simd_fallback_features=("asimd",),
        ),
        HardwareProfile(
            "sapphirerapids-cpu",
            "cpu",
            "Intel Xeon Platinum 8480+ (Sapphire Rapids, 56 cores)",
            40e12,
            307e9,
            256 * GIB,
            0.30,
            0.60,
            0.008,
            0.006,
            0.10,
            16,
            2048,
            "bf16",
            "TORCH_SDPA",
            simd_features=("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile"),
            simd_fallback_features=("avx2", "fma"),
        ),
    )
}

BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "awq-int4": 0.56, "gptq-int4": 0.56}


@dataclass(frozen=True, slots=True)
class ModelSize:
    """Shape of a decoder-only transformer, enough to size weights and the KV cache."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int
    max_model_len: int = 8192

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2.0) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


# Presets by size in billions of parameters (Qwen2.5-0.5B, Llama-3.2-1B/3B, Llama-3.1-8B, Llama-2-13B,
# Llama-3.1-70B shapes).
SIZES: dict[float, ModelSize] = {
    0.5: ModelSize(0.5e9, 24, 2, 64),
    1.0: ModelSize(1.2e9, 16, 8, 64),
    3.0: ModelSize(3.2e9, 28, 8, 128),
    7.0: ModelSize(7.2e9, 32, 8, 128),
    8.0: ModelSize(8.0e9, 32, 8, 128),
    13.0: ModelSize(13e9, 40, 40, 128, 4096),
    70.0: ModelSize(70.6e9, 80, 8, 128),
}
DEFAULT_SIZE_B = 8.0
_SIZE_IN_NAME = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")


def model_size(model_name: str, params_b: float | None = None) -> ModelSize:
    """The preset nearest to ``params_b`` (or to the size written in the name, e.g. ``Llama-3.1-8B``)."""
    if params_b is None:
        m = _SIZE_IN_NAME.search(model_name)
        params_b = float(m.group(1)) if m else DEFAULT_SIZE_B
    if params_b <= 0:
        raise ValueError(f"model size must be positive, got {params_b}B")
    nearest = min(SIZES, key=lambda s: abs(math.log(s / params_b)))
    preset = SIZES[nearest]
    if math.isclose(nearest, params_b, rel_tol=0.2):
        return preset
    scale = params_b / nearest
    return ModelSize(params_b * 1e9, max(1, round(preset.layers * scale**0.4)), preset.kv_heads, preset.head_dim)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model placed on hardware: what the timing model and the runtime profile read."""

    model: str
    hardware: HardwareProfile
    size: ModelSize
    quantization: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_seqs: int = 0  # 0: the hardware profile's default
    max_num_batched_tokens: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def weight_bytes(self) -> float:
        return self.size.params * BYTES_PER_PARAM[self.quantization]

    @property
    def weight_bytes_per_device(self) -> float:
        return self.weight_bytes / self.tensor_parallel_size

    @property
    def num_gpu_blocks(self) -> int:
        """KV-cache blocks left after the weights and a 1 GiB activation reserve (as vLLM profiles it)."""
        free = (
            self.hardware.memory_bytes * self.gpu_memory_utilization - self.weight_bytes_per_device - GIB
        ) * self.tensor_parallel_size
        per_block = self.size.kv_bytes_per_token() * self.block_size
        return int(free // per_block)

    @property
    def seqs(self) -> int:
        return self.max_num_seqs or self.hardware.max_num_seqs

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or self.hardware.max_num_batched_tokens


def deploy(
    model: str,
    hardware: str,
    params_b: float | None = None,
    quantization: str | None = None,
    tensor_parallel_size: int = 1,
    max_num_seqs: int = 0,
    max_num_batched_tokens: int = 0,
    max_model_len: int = 0,
) -> Deployment:
    """Place ``model`` on ``hardware``; raise ValueError when it cannot fit (as vLLM refuses to start)."""
    if hardware not in PROFILES:
        raise ValueError(f"unknown hardware profile {hardware!r} (known: {', '.join(PROFILES)})")
    hw = PROFILES[hardware]
    quant = quantization or hw.default_quantization
    if quant not in BYTES_PER_PARAM:
        raise ValueError(f"unknown quantization {quant!r} (known: {', '.join(BYTES_PER_PARAM)})")
    if tensor_parallel_size < 1:
        raise ValueError("tensor parallel size must be >= 1")
    size = model_size(model, params_b)
    if max_model_len:
        size = ModelSize(size.params, size.layers, size.kv_heads, size.head_dim, max_model_len)
    dep = Deployment(
        model,
        hw,
        size,
        quant,
        tensor_parallel_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    if dep.num_gpu_blocks * dep.block_size < size.max_model_len:
        raise ValueError(
            f"{model} ({size.params / 1e9:.1f}B, {quant}) does not fit on {hardware} with tensor parallel "
            f"{tensor_parallel_size}: weights {dep.weight_bytes_per_device / GIB:.1f} GiB per device of "
            f"{hw.memory_bytes / GIB:.0f} GiB leave no room for one {size.max_model_len}-token sequence; "
            "use a smaller quantization or more tensor parallelism"
        )
    return dep
