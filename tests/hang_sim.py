"""The simulator's engines in virtual time, scraped like the agent scrapes them: for the hang detector's tests.

The real scheduler (:class:`inferwatch.simulator.engine.EngineCore`), the real vLLM exposition
(:class:`inferwatch.simulator.metrics. VllmMetrics`, rendered by prometheus_client) and the agent's own parser; only the
clock is virtual, so ten minutes of a slow CPU profile take a second. A rank can be hung (its core is not stepped;
arrivals still queue, as the ``hang`` scenario does live) and the whole engine restarted (new registry: counters back to
zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import generate_latest

from inferwatch.agent.node.collectors.engine import READ_AGAIN_MARGIN_S
from inferwatch.agent.node.engine.adapters import EngineReading
from inferwatch.agent.node.engine.hang import HangDetector, RankVerdict
from inferwatch.agent.node.engine.scrape import EngineParser
from inferwatch.simulator.engine import EngineCore, SimRequest, Step
from inferwatch.simulator.metrics import VllmMetrics
from inferwatch.simulator.profiles import deploy
from inferwatch.simulator.runtime import _Listener
from inferwatch.simulator.scenarios import ScenarioSet

MODEL = "m"
SCRAPE_S = 15.0  # production scrape interval


@dataclass
class _Rank:
    core: EngineCore
    clock: float = 0.0
    step: Step | None = None


@dataclass
class VirtualEngine:
    hardware: str
    params_b: float = 8.0
    engines: int = 1
    max_model_len: int = 0
    max_num_seqs: int = 0
    seed: int = 0
    now: float = 0.0
    hung: set[int] = field(default_factory=set)
    _n: int = 0

    def __post_init__(self) -> None:
        self.dep = deploy(
            MODEL, self.hardware, params_b=self.params_b, max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
        )  # fmt: skip
        self.restart()

    def restart(self) -> None:
        """A new engine process: fresh scheduler, empty KV cache, counters from zero."""
        self.metrics = VllmMetrics(self.dep.size.max_model_len, process_metrics=False)
        scenarios = ScenarioSet()
        self.ranks = [
            _Rank(
                EngineCore(i, self.dep, scenarios, _Listener(self.metrics.engine(MODEL, i, self.dep), None), self.seed)
            )
            for i in range(self.engines)
        ]
        for r in self.ranks:
            r.clock = self.now

    def submit(self, prompt_tokens: int, max_tokens: int, rank: int | None = None) -> SimRequest:
        self._n += 1
        req = SimRequest(f"r{self._n}", prompt_tokens, max_tokens, self.now, ignore_eos=True)
        target = self.ranks[rank] if rank is not None else min(self.ranks, key=lambda r: r.core.load)
        target.core.add(req)
        return req

    def advance(self, until: float) -> None:
        for i, r in enumerate(self.ranks):
            core = r.core
            if i in self.hung:
                core.stalled(until)
                r.clock = until
                continue
            while r.clock < until:
                if r.step is not None:
                    end = r.step.start + r.step.duration
                    if end > until:
                        r.clock = until
                        break
                    core.complete(r.step, end)
                    r.clock, r.step = end, None
                    continue
                r.step = core.plan(r.clock)
                if r.step is None:
                    wake = core.next_wakeup()
                    r.clock = wake if wake is not None and r.clock < wake <= until else until
        self.now = until

    def exposition(self) -> bytes:
        return generate_latest(self.metrics.registry)


@dataclass
class Scraper:
    """The agent's side: parse each scrape and feed the detector at the scrape's (virtual) time."""

    engine: VirtualEngine
    detector: HangDetector
    parser: EngineParser = field(default_factory=EngineParser)
    history: list[tuple[float, list[RankVerdict]]] = field(default_factory=list)

    def scrape(self) -> EngineReading:
        reading = self.parser.parse(self.engine.exposition())
        self.history.append((self.engine.now, self.detector.update(self.engine.now, reading)))
        return reading

    def run(
        self, seconds: float, every_s: float = SCRAPE_S, deadline_reads: bool = False, grid_from: float | None = None
    ) -> None:
        """Scrape every ``every_s`` for ``seconds`` (on a grid from ``grid_from``, default now); with
        ``deadline_reads``, also when the detector's next verdict is due (:attr:`HangDetector.next_at`,
        ``READ_AGAIN_MARGIN_S`` after it), as the agent's runner does."""
        end = self.engine.now + seconds
        grid = (self.engine.now if grid_from is None else grid_from) + every_s
        while grid <= self.engine.now:
            grid += every_s
        while True:
            at = grid
            due = self.detector.next_at
            if deadline_reads and due is not None and self.engine.now < due + READ_AGAIN_MARGIN_S < grid:
                at = due + READ_AGAIN_MARGIN_S
            if at > end + 1e-9:
                return
            self.engine.advance(at)
            self.scrape()
            if at == grid:
                grid += every_s

    def first_stalled(self) -> float | None:
        return next((t for t, vs in self.history if any(v.stalled for v in vs)), None)

    def max_stall(self) -> float:
        return max((v.stall_s for _t, vs in self.history for v in vs), default=0.0)
