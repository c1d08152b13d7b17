"""Settings of one simulator process (built by ``inferwatch simulate`` from its flags)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from inferwatch.simulator.engine import Features
from inferwatch.simulator.scenarios import Scenario

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_HARDWARE = "h100"
DEFAULT_PORT = 8000
DEFAULT_DEBUG_HEADER = "X-Runtime-Debug: runtime_profile=1"
CONTROL_TOKEN_ENV = "INFERWATCH_SIM_CONTROL_TOKEN"
MAX_BODY_BYTES = 8 << 20
ENGINE_VERSION = "0.12.0"


@dataclass(frozen=True, slots=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    hardware: str = DEFAULT_HARDWARE
    params_b: float | None = None  # model size override, billions of parameters
    quantization: str | None = None
    tensor_parallel_size: int = 1
    engines: int = 1  # data-parallel engines per model
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    max_model_len: int = 0
    scenarios: tuple[Scenario, ...] = ()
    seed: int = 0
    otlp_traces_endpoint: str | None = None
    stock_spans: bool = False  # spans as stock vLLM v1 sends them: no vllm.dp_rank, no vllm.num_preemptions
    debug_profile: bool = False
    debug_header: str = DEFAULT_DEBUG_HEADER
    control_token: str | None = None
    show_hidden_metrics: bool = False
    features: Features = field(default_factory=Features)  # speculative decoding, LoRA, KV connector
    loop: str = "auto"  # uvicorn event loop: auto (uvloop when installed), uvloop, asyncio
    http: str = "auto"  # uvicorn HTTP parser: auto (httptools when installed), httptools, h11
    extra: dict[str, str] = field(default_factory=dict)

    def token(self) -> str | None:
        return self.control_token or os.environ.get(CONTROL_TOKEN_ENV) or None

    def debug_header_pair(self) -> tuple[str, str]:
        name, sep, value = self.debug_header.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"debug header must be 'Name: value', got {self.debug_header!r}")
        return name.strip().lower(), value.strip()
