"""``inferwatch simd``: on-demand SIMD utilisation analysis of one runtime process (exit 0 used / idle, 1 unused).

Observes the process twice, ``--window`` seconds apart, and prints the verdict with its evidence; ``--objdump``
adds an exact disassembler count of AVX-512 instructions per mapped file (slow: seconds per library).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from inferwatch.agent.cli.common import ProcfsOpt


def register(app: typer.Typer) -> None:
    @app.command()
    def simd(
        pid: int | None = typer.Option(None, "--pid", help="Runtime process id."),
        port: int | None = typer.Option(None, "--port", help="Find the runtime by the TCP port it listens on."),
        pattern: str | None = typer.Option(None, "--pattern", help="Find the runtime by a command-line regex."),
        window: float = typer.Option(3.0, "--window", min=0.2, max=600, help="Observation window in seconds."),
        objdump: bool = typer.Option(False, "--objdump", help="Cross-check code counts with objdump -d."),
        procfs: Path | None = ProcfsOpt,
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    ) -> None:
        """Is the runtime executing AVX-512 / SVE while it serves? (per-thread arch_status, mapped code, PMU)"""
        import time

        from inferwatch.agent.config import RuntimeSettings
        from inferwatch.agent.errors import ConfigError, InferwatchError, NoDataError
        from inferwatch.agent.node.host.runtime import RuntimeLocator
        from inferwatch.agent.node.simd.analysis import SimdAnalyzer

        root = procfs or Path("/proc")
        try:
            runtime = RuntimeSettings(pid=pid, cmdline_pattern=pattern)
        except Exception as exc:
            typer.echo(f"inferwatch: {ConfigError(str(exc))}", err=True)
            raise typer.Exit(2) from None
        if pid is None and pattern is None and port is None:
            typer.echo("inferwatch: give --pid, --port or --pattern", err=True)
            raise typer.Exit(2)
        try:
            target = RuntimeLocator(runtime, root).find_serving(port).pid
            analyzer = SimdAnalyzer(root, target)
            analyzer.observe()
            time.sleep(window)
            reports = analyzer.observe()
            analyzer.close()
        except NoDataError as exc:
            typer.echo(f"inferwatch: {exc}", err=True)
            raise typer.Exit(2) from None
        out: list[dict[str, Any]] = []
        for r in reports:
            item: dict[str, Any] = {
                "feature": r.feature,
                "verdict": r.verdict,
                "used": r.used,
                "summary": r.summary,
                "capable": r.capable,
                "code_instructions": r.code_instructions,
                "libc_instructions": r.libc_instructions,
                "threads_total": r.threads_total,
                "threads_active": r.threads_active,
                "attributable": r.attributable,
                "pmu_ratio": r.pmu_ratio,
                "runtime_cpu_cores": round(r.busy_cpu, 3),
                "evidence": r.evidence,
            }
            if objdump and r.feature == "avx512":
                from inferwatch.agent.node.simd.objdump import count_avx512_objdump

                exact: dict[str, Any] = {}
                for path in r.evidence.get("code_by_file", {}):
                    try:
                        exact[path] = count_avx512_objdump(Path(path))
                    except InferwatchError as exc:
                        exact[path] = str(exc)
                item["objdump_avx512_by_file"] = exact
            out.append(item)
        if as_json:
            typer.echo(json.dumps({"pid": target, "window_s": window, "features": out}, indent=2, default=str))
        else:
            for item in out:
                typer.echo(f"pid {target} {item['feature']}: {item['verdict']} — {item['summary']}")
                for key in (
                    "code_instructions",
                    "threads_active",
                    "threads_total",
                    "attributable",
                    "runtime_cpu_cores",
                ):
                    typer.echo(f"  {key}: {item[key]}")
                for path, n in item["evidence"].get("code_by_file", {}).items():
                    typer.echo(f"  code {path}: {n}")
                for path, n in item.get("objdump_avx512_by_file", {}).items():
                    typer.echo(f"  objdump {path}: {n}")
        raise typer.Exit(1 if any(r.verdict == "unused" for r in reports) else 0)
