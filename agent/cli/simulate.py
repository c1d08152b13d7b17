"""``inferwatch simulate``: a vLLM-compatible runtime simulator with fault scenarios (see docs/simulator.md)."""

from __future__ import annotations

import typer

from inferwatch.agent.cli.common import setup_logging


def register(app: typer.Typer) -> None:
    @app.command()
    def simulate(
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
        port: int = typer.Option(8000, "--port", help="Port to serve on."),
        model: list[str] = typer.Option(
            None, "--model", help="Served model name (repeatable; default meta-llama/Llama-3.1-8B-Instruct)."
        ),
        hardware: str = typer.Option(
            "h100", "--hardware", help="Hardware profile: h100, a100, l40s, graviton3-cpu, sapphirerapids-cpu."
        ),
        params_b: float | None = typer.Option(
            None, "--model-size", help="Model size in billions of parameters (default: read from the name, else 8)."
        ),
        quantization: str | None = typer.Option(None, "--quantization", help="bf16, fp16, fp8, int8, awq-int4, ..."),
        tensor_parallel: int = typer.Option(1, "--tensor-parallel-size", help="Devices per engine."),
        engines: int = typer.Option(1, "--engines", help="Data-parallel engines per model (label engine=0..N-1)."),
        max_num_seqs: int = typer.Option(0, "--max-num-seqs", help="Sequences per batch (0: profile default)."),
        max_batched: int = typer.Option(0, "--max-num-batched-tokens", help="Token budget per step (0: default)."),
        max_model_len: int = typer.Option(0, "--max-model-len", help="Context length (0: 8192)."),
        scenario: list[str] = typer.Option(
            None, "--scenario", help="Fault scenario NAME[:key=value,...] (repeatable); see docs/simulator.md."
        ),
        seed: int = typer.Option(0, "--seed", help="Seed of the timing model (same seed, same latencies)."),
        otlp: str | None = typer.Option(
            None, "--otlp-traces-endpoint", help="Send one llm_request span per request to this OTLP endpoint."
        ),
        stock_spans: bool = typer.Option(
            False, "--stock-spans", help="Spans as stock vLLM v1 sends them: no vllm.dp_rank, no vllm.num_preemptions."
        ),
        debug_profile: bool = typer.Option(
            False, "--debug-profile", help="Enable GET /debug/runtime_profile (only at start, like the real thing)."
        ),
        debug_header: str = typer.Option(
            "X-Runtime-Debug: runtime_profile=1", "--debug-header", help="Header that unlocks the debug profile."
        ),
        control_token: str | None = typer.Option(
            None, "--control-token", help="Bearer token of POST /control/scenario (or INFERWATCH_SIM_CONTROL_TOKEN)."
        ),
        show_hidden: str | None = typer.Option(
            None, "--show-hidden-metrics-for-version", help="Also expose deprecated metrics (vLLM flag, e.g. 0.11)."
        ),
        num_speculative_tokens: int = typer.Option(
            0, "--num-speculative-tokens", help="Draft tokens per step (vLLM flag; 0: no speculative decoding)."
        ),
        max_loras: int = typer.Option(0, "--max-loras", help="LoRA adapter slots per batch (vLLM flag; 0: LoRA off)."),
        lora_adapters: int = typer.Option(
            0, "--lora-adapters", help="Distinct LoRA adapters in the traffic mix (0: as many as --max-loras)."
        ),
        kv_connector: bool = typer.Option(
            False, "--kv-connector", help="Decode side of a P/D pair: prompt KV pulled over NIXL (vLLM's connector)."
        ),
        log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
        loop: str = typer.Option("auto", "--loop", help="Event loop: auto (uvloop when installed), uvloop, asyncio."),
        http: str = typer.Option(
            "auto", "--http", help="HTTP parser: auto (httptools when installed), httptools, h11."
        ),
    ) -> None:
        """Serve a simulated vLLM: OpenAI and Anthropic APIs, vLLM /metrics, OTLP spans, fault scenarios."""
        from inferwatch.simulator.config import DEFAULT_MODEL, SimConfig
        from inferwatch.simulator.engine import Features
        from inferwatch.simulator.scenarios import ScenarioError, parse

        setup_logging(log_level)
        try:
            config = SimConfig(
                host=host,
                port=port,
                models=tuple(model or (DEFAULT_MODEL,)),
                hardware=hardware,
                params_b=params_b,
                quantization=quantization,
                tensor_parallel_size=tensor_parallel,
                engines=engines,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_batched,
                max_model_len=max_model_len,
                scenarios=tuple(parse(s) for s in scenario or ()),
                seed=seed,
                otlp_traces_endpoint=otlp,
                stock_spans=stock_spans,
                debug_profile=debug_profile,
                debug_header=debug_header,
                control_token=control_token,
                show_hidden_metrics=show_hidden is not None,
                features=Features(num_speculative_tokens, max_loras, lora_adapters, kv_connector),
                loop=loop,
                http=http,
            )
            if engines < 1:
                raise ValueError("--engines must be >= 1")
            if min(num_speculative_tokens, max_loras, lora_adapters) < 0 or num_speculative_tokens > 64:
                raise ValueError("--num-speculative-tokens must be 0..64, --max-loras and --lora-adapters >= 0")
            config.debug_header_pair()
            from inferwatch.simulator.serve import serve, server_impl

            server_impl(loop, http)  # a bad or missing choice is a usage error (exit 2)

            serve(config)
        except (ScenarioError, ValueError) as exc:
            typer.echo(f"inferwatch simulate: {exc}", err=True)
            raise typer.Exit(2) from None
