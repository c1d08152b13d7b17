"""``inferwatch drift``: the same prompts, greedy decoding, on several endpoints; where their outputs part
(agent/fleet/drift.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

FORMATS = ("table", "json")


def register(app: typer.Typer) -> None:
    @app.command()
    def drift(
        endpoint: list[str] = typer.Option(
            [],
            "--endpoint",
            help="NAME=URL of an OpenAI-compatible (or, with --api anthropic, Messages API) server; repeat for "
            "each. Without --reference the first is the reference the others are compared with.",
        ),
        reference: Path | None = typer.Option(
            None, "--reference", help="Answers stored earlier (--save) to compare every endpoint with."
        ),
        api: str = typer.Option("openai", "--api", help="openai (chat completions) | anthropic (messages)"),
        model: str | None = typer.Option(None, "--model", help="Model name (default: the first /v1/models lists)."),
        prompts: Path | None = typer.Option(
            None, "--prompts", help="YAML/JSON mapping prompt id -> text (default: a built-in set of 8)."
        ),
        max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens to generate per prompt."),
        seed: int = typer.Option(1234, "--seed", help="Sampling seed sent with every request."),
        top_logprobs: int = typer.Option(5, "--top-logprobs", help="Top log-probabilities per token (0: none)."),
        max_logprob_delta: float = typer.Option(
            0.01,
            "--max-logprob-delta",
            help="Flag a node whose token log-probabilities move more than this before any divergence.",
        ),
        save: Path | None = typer.Option(None, "--save", help="Directory: store each endpoint's answers as NAME.json."),
        fmt: str = typer.Option("table", "--format", help="table | json"),
        show_prompts: bool = typer.Option(
            False, "--show-prompts", help="Store and print the prompt text (default: ids and SHA-256 only)."
        ),
        api_key_env: str | None = typer.Option(
            None, "--api-key-env", help="Environment variable holding the API key (never a flag: it would be logged)."
        ),
        timeout: float = typer.Option(120.0, "--timeout", help="HTTP timeout per request, seconds."),
    ) -> None:
        """Send a fixed prompt set with greedy decoding (temperature 0, fixed seed, top log-probabilities where
        offered) to each endpoint; report per prompt the first token where the outputs diverge and the
        log-probability differences before it. Exit 1 when an endpoint drifts from the reference."""
        from inferwatch.agent.errors import ConfigError
        from inferwatch.agent.fleet.drift import (
            DriftError,
            compare,
            load_answers,
            load_prompts,
            parse_endpoint,
            report_lines,
            run_prompts,
        )

        if fmt not in FORMATS:
            typer.echo(f"inferwatch: --format must be one of {', '.join(FORMATS)} (got {fmt!r})", err=True)
            raise typer.Exit(2)
        try:
            endpoints = [parse_endpoint(e, api) for e in endpoint]
            if len({e.name for e in endpoints}) != len(endpoints):
                raise ConfigError("endpoint names must differ")
            if not endpoints or (reference is None and len(endpoints) < 2):
                raise ConfigError("give two or more --endpoint, or --reference FILE and one or more --endpoint")
            prompt_set = load_prompts(prompts)
            ref = load_answers(reference) if reference is not None else None
            key = None
            if api_key_env:
                key = os.environ.get(api_key_env)
                if not key:
                    raise ConfigError(f"--api-key-env {api_key_env}: the variable is not set")
            if save is not None:
                save.mkdir(parents=True, exist_ok=True)
        except (ConfigError, OSError) as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(2) from None
        results = []
        try:
            for ep in endpoints:
                answers = run_prompts(
                    ep,
                    prompt_set,
                    model=model or (ref.model if ref else None),
                    max_tokens=max_tokens,
                    seed=seed,
                    top_logprobs=top_logprobs,
                    api_key=key,
                    show_prompts=show_prompts,
                    timeout_s=timeout,
                )
                results.append(answers)
                if save is not None:
                    (save / f"{ep.name}.json").write_text(answers.to_json() + "\n", encoding="utf-8")
        except (DriftError, ConfigError) as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(1 if isinstance(exc, DriftError) else 2) from None
        base = ref if ref is not None else results[0]
        reports = [compare(base, r, max_logprob_delta) for r in (results if ref is not None else results[1:])]
        if fmt == "json":
            typer.echo(json.dumps([r.to_dict() for r in reports], indent=2, ensure_ascii=False))
        else:
            for r in reports:
                typer.echo("\n".join(report_lines(r)))
            if show_prompts:
                typer.echo("prompts:")
                for pid, text in prompt_set.items():
                    typer.echo(f"  {pid}: {text}")
        if any(r.flagged for r in reports):
            raise typer.Exit(1)
