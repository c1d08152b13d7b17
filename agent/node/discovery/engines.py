"""Known engine images and ports: how a pod without ``inferwatch.io/*`` annotations is recognised as an engine.

The fallback of :mod:`inferwatch.agent.node.discovery.kubernetes` (``discovery.image_fallback``), documented in
docs/kubernetes.md ("Discovery"). An image matches when one of ``image_words`` is in its repository (the image
reference without tag or digest, lower-cased). The metrics port is the first of ``ports`` the container declares,
else the first of ``ports`` (the engine's default listen port).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KnownEngine:
    kind: str
    image_words: tuple[str, ...]
    ports: tuple[int, ...]  # metrics port candidates, the default first
    metrics_path: str = "/metrics"
    health_path: str = "/health"
    health_port: int | None = None  # None: the metrics port


KNOWN_ENGINES: tuple[KnownEngine, ...] = (
    # vllm/vllm-openai: `vllm serve` listens on 8000, /metrics and /health on the same port.
    KnownEngine("vllm", ("vllm",), (8000,)),
    # lmsysorg/sglang: `python -m sglang.launch_server` listens on 30000 (--port).
    KnownEngine("sglang", ("sglang",), (30000,)),
    # ghcr.io/huggingface/text-generation-inference: the image's PORT is 80; the launcher's own default is 3000.
    KnownEngine("tgi", ("text-generation-inference",), (80, 3000)),
    # ghcr.io/ggml-org/llama.cpp:server: llama-server listens on 8080; /metrics needs --metrics.
    KnownEngine("llamacpp", ("llama.cpp", "llama-cpp", "llamacpp"), (8080,)),
    # nvcr.io/nvidia/tritonserver (TensorRT-LLM backend): metrics on 8002, HTTP (and its health) on 8000.
    KnownEngine("trtllm", ("tritonserver",), (8002,), health_path="/v2/health/ready", health_port=8000),
)


def image_repository(image: str) -> str:
    """``registry/name`` of an image reference, lower-cased, without ``:tag`` or ``@digest``."""
    ref = image.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        ref = ref[:colon]
    return ref.lower()


def known_engine(image: str) -> KnownEngine | None:
    repo = image_repository(image)
    for engine in KNOWN_ENGINES:
        if any(word in repo for word in engine.image_words):
            return engine
    return None
