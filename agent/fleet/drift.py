"""Output drift across hardware: the same prompts, greedy decoding, several endpoints, token by token.

``inferwatch drift`` (agent/cli/drift.py) sends a fixed prompt set to each endpoint with temperature 0, a fixed
seed and, where the API offers them, the top log-probabilities of every generated token; stores each answer
(:func:`run_prompts` -> :class:`Answers`, JSON); and compares a candidate's answers with a reference's
(:func:`compare`): per prompt the first token position where the outputs diverge, the log-probability
differences of the tokens before it, and at the divergence whether the two choices were a near tie in the
reference's own top log-probabilities (the usual signature of a hardware-induced flip: a different reduction order
in a SIMD or GPU kernel moves the logits by ~1e-6..1e-3 and turns over a tie).

APIs:

- ``openai``: ``POST {url}/v1/chat/completions`` with ``temperature: 0, seed, logprobs: true, top_logprobs: K``
  (vLLM, SGLang, TGI, llama.cpp's server, OpenAI); tokens and log-probabilities come from
  ``choices[0].logprobs.content``. A server that answers without them is compared on its text.
- ``anthropic``: ``POST {url}/v1/messages`` with ``temperature: 0`` (the Messages API has no seed and no
  log-probabilities: compared on text, character by character).

Prompt text is never stored, printed or put in an error message unless asked (``show_prompts``): answers carry
the prompt's id and SHA-256 only. The generated text is stored (it is what is compared).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from inferwatch.agent.common.httpclient import http_client
from inferwatch.agent.common.redact import redact_url
from inferwatch.agent.errors import ConfigError, InferwatchError

APIS = ("openai", "anthropic")
DEFAULT_MAX_TOKENS = 32
DEFAULT_SEED = 1234
DEFAULT_TOP_LOGPROBS = 5
DEFAULT_TIMEOUT_S = 120.0
# |logprob(candidate) - logprob(reference)| of any token before the divergence above this flags the node even when
# every token agrees: the logits moved (a different kernel or precision) although greedy decoding hid it so far.
DEFAULT_MAX_LOGPROB_DELTA = 0.01
NEAR_TIE_LOGPROB = 0.05  # the reference's top-2 gap at a divergence under this: a tie the hardware turned over
MAX_PROMPTS = 1000
MAX_PROMPT_FILE_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 8 << 20
ANTHROPIC_VERSION = "2023-06-01"
FORMAT_VERSION = 1

# The fixed default prompt set: short, varied (arithmetic, code, facts, lists, a long-ish instruction), so that a
# divergence shows up early in some and late in others. Ids are stable; change the text, change the id.
DEFAULT_PROMPTS: dict[str, str] = {
    "arith": "What is 17 multiplied by 23? Answer with the number only.",
    "count": "Count from one to twenty in words, separated by commas.",
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "capital": "Name the capital cities of France, Japan, Brazil, Kenya and Canada.",
    "define": "In two sentences, explain what a memory bandwidth bound workload is.",
    "list": "List five prime numbers greater than one hundred.",
    "story": "Write the first three sentences of a story about a lighthouse keeper.",
    "translate": "Translate 'the quick brown fox jumps over the lazy dog' into French.",
}


class DriftError(InferwatchError):
    """An endpoint could not be asked, or answered something that is not a completion."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    url: str
    api: str = "openai"


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float


@dataclass(frozen=True, slots=True)
class Answer:
    """One prompt's greedy answer. ``tokens``/``logprobs``/``top``: empty when the API gives no log-probabilities
    (then ``text`` is compared). ``prompt``: only when stored with show_prompts."""

    prompt_id: str
    prompt_sha256: str
    text: str
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float, ...] = ()
    top: tuple[tuple[TopLogprob, ...], ...] = ()
    finish_reason: str = ""
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class Answers:
    """Every answer of one endpoint, with what was asked (the settings the comparison must share)."""

    endpoint: str
    url: str
    api: str
    model: str
    max_tokens: int
    seed: int
    top_logprobs: int
    answers: tuple[Answer, ...]
    version: int = FORMAT_VERSION

    def by_id(self) -> dict[str, Answer]:
        return {a.prompt_id: a for a in self.answers}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False)


def parse_endpoint(spec: str, api: str) -> Endpoint:
    """``NAME=URL`` (or a bare URL, named after its host:port)."""
    if api not in APIS:
        raise ConfigError(f"api must be one of {', '.join(APIS)} (got {api!r})")
    name, sep, url = spec.partition("=")
    if not sep:
        name, url = "", spec
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint {spec!r}: expected NAME=URL with an http(s) URL")
    url = url.rstrip("/")
    name = name or httpx.URL(url).netloc.decode()
    if not name.replace("-", "").replace("_", "").replace(".", "").replace(":", "").isalnum():
        raise ConfigError(f"endpoint name {name!r}: letters, digits, '-', '_', '.', ':' only")
    return Endpoint(name, url, api)


def load_prompts(path: Path | None) -> dict[str, str]:
    """The prompt set: a JSON or YAML mapping id -> prompt text, or the built-in :data:`DEFAULT_PROMPTS`."""
    if path is None:
        return dict(DEFAULT_PROMPTS)
    try:
        raw = path.read_bytes()[: MAX_PROMPT_FILE_BYTES + 1]
    except OSError as exc:
        raise ConfigError(f"prompt file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PROMPT_FILE_BYTES:
        raise ConfigError(f"prompt file {path}: larger than {MAX_PROMPT_FILE_BYTES} bytes")
    import yaml

    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"prompt file {path}: not a YAML/JSON mapping ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"prompt file {path}: expected a mapping of prompt id -> prompt text")
    if len(data) > MAX_PROMPTS:
        raise ConfigError(f"prompt file {path}: {len(data)} prompts (at most {MAX_PROMPTS})")
    out: dict[str, str] = {}
    for k, v in data.items():
        if not isinstance(k, str) or not isinstance(v, str) or not v:
            raise ConfigError(f"prompt file {path}: prompt {k!r}: ids and prompts must be non-empty strings")
        out[k] = v
    return out


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _post(
    client: httpx.Client, ep: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str], pid: str
) -> Any:
    shown = redact_url(ep.url)
    try:
        r = client.post(f"{ep.url}{path}", json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise DriftError(f"{ep.name} ({shown}): prompt {pid}: {type(exc).__name__}: {exc}") from None
    if len(r.content) > MAX_RESPONSE_BYTES:
        raise DriftError(f"{ep.name}: prompt {pid}: answer larger than {MAX_RESPONSE_BYTES} bytes")
    if r.status_code != 200:
        # The body can echo the prompt: it is not repeated here.
        raise DriftError(f"{ep.name} ({shown}{path}): prompt {pid}: HTTP {r.status_code}")
    try:
        return r.json()
    except ValueError:
        raise DriftError(f"{ep.name} ({shown}{path}): prompt {pid}: the answer is not JSON") from None


def discover_model(client: httpx.Client, ep: Endpoint) -> str:
    """The first model an OpenAI-compatible server lists at /v1/models."""
    try:
        data = client.get(f"{ep.url}/v1/models").json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        raise DriftError(f"{ep.name}: no model given and {redact_url(ep.url)}/v1/models lists none") from None


def _openai_answer(data: Any, pid: str, digest: str, ep: Endpoint) -> Answer:
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise DriftError(f"{ep.name}: prompt {pid}: not a chat completion") from None
    content = (choice.get("logprobs") or {}).get("content") or []
    tokens: list[str] = []
    lps: list[float] = []
    tops: list[tuple[TopLogprob, ...]] = []
    for item in content:
        if not isinstance(item, dict) or "token" not in item or "logprob" not in item:
            raise DriftError(f"{ep.name}: prompt {pid}: malformed logprobs.content item")
        tokens.append(str(item["token"]))
        lps.append(float(item["logprob"]))
        tops.append(
            tuple(
                TopLogprob(str(t["token"]), float(t["logprob"]))
                for t in item.get("top_logprobs") or []
                if isinstance(t, dict) and "token" in t and "logprob" in t
            )
        )
    return Answer(pid, digest, text, tuple(tokens), tuple(lps), tuple(tops), str(choice.get("finish_reason") or ""))


def _anthropic_answer(data: Any, pid: str, digest: str, ep: Endpoint) -> Answer:
    try:
        text = "".join(b.get("text", "") for b in data["content"] if isinstance(b, dict) and b.get("type") == "text")
    except (KeyError, TypeError):
        raise DriftError(f"{ep.name}: prompt {pid}: not a Messages API answer") from None
    return Answer(pid, digest, text, finish_reason=str(data.get("stop_reason") or ""))


def run_prompts(
    ep: Endpoint,
    prompts: Mapping[str, str],
    model: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = DEFAULT_SEED,
    top_logprobs: int = DEFAULT_TOP_LOGPROBS,
    api_key: str | None = None,
    show_prompts: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client: httpx.Client | None = None,
) -> Answers:
    """Ask ``ep`` every prompt, one at a time (no batching: a batch changes the kernels' shapes and so the
    numerics), with greedy decoding."""
    if max_tokens < 1 or top_logprobs < 0 or top_logprobs > 20:
        raise ConfigError("max_tokens must be >= 1 and top_logprobs between 0 and 20")
    own = client is None
    c = client or http_client("drift", timeout=timeout_s, trust_env=True)
    try:
        if model is None:
            if ep.api == "anthropic":
                raise ConfigError("--model is required for the anthropic API")
            model = discover_model(c, ep)
        answers = []
        for pid, prompt in prompts.items():
            digest = sha256(prompt)
            messages = [{"role": "user", "content": prompt}]
            if ep.api == "openai":
                body: dict[str, Any] = {
                    "model": model,
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "seed": seed,
                }
                if top_logprobs:
                    body |= {"logprobs": True, "top_logprobs": top_logprobs}
                headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
                answer = _openai_answer(_post(c, ep, "/v1/chat/completions", body, headers, pid), pid, digest, ep)
            else:
                body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
                headers = {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": api_key} if api_key else {})}
                answer = _anthropic_answer(_post(c, ep, "/v1/messages", body, headers, pid), pid, digest, ep)
            if show_prompts:
                answer = replace(answer, prompt=prompt)
            answers.append(answer)
        return Answers(ep.name, redact_url(ep.url), ep.api, model, max_tokens, seed, top_logprobs, tuple(answers))
    finally:
        if own:
            c.close()


def load_answers(path: Path) -> Answers:
    """Answers stored by :meth:`Answers.to_json` (``inferwatch drift --save``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        answers = tuple(
            Answer(
                a["prompt_id"],
                a["prompt_sha256"],
                a["text"],
                tuple(a.get("tokens", ())),
                tuple(float(x) for x in a.get("logprobs", ())),
                tuple(tuple(TopLogprob(t["token"], float(t["logprob"])) for t in top) for top in a.get("top", ())),
                a.get("finish_reason", ""),
                a.get("prompt"),
            )
            for a in data["answers"]
        )
        return Answers(
            data["endpoint"],
            data["url"],
            data["api"],
            data["model"],
            int(data["max_tokens"]),
            int(data["seed"]),
            int(data["top_logprobs"]),
            answers,
            int(data.get("version", FORMAT_VERSION)),
        )
    except OSError as exc:
        raise ConfigError(f"answers file {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"answers file {path}: not answers stored by inferwatch drift ({exc!r})") from None


# --- comparison ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptDrift:
    """One prompt, candidate against reference.

    ``unit``: "token" (both have log-probabilities) or "char" (text only). ``diverged_at``: the first differing
    position (a shorter answer that is a prefix of the other diverges at its end), None when identical.
    ``max_abs_logprob_delta`` / ``mean_abs_logprob_delta``: over the tokens before the divergence (None without
    log-probabilities). At the divergence: both tokens, their log-probabilities in the reference's top list, and
    the reference's gap between its top two (``reference_top2_gap``)."""

    prompt_id: str
    unit: str
    length_reference: int
    length_candidate: int
    diverged_at: int | None
    max_abs_logprob_delta: float | None = None
    mean_abs_logprob_delta: float | None = None
    reference_token: str | None = None
    candidate_token: str | None = None
    reference_top2_gap: float | None = None
    candidate_token_in_reference_top: bool | None = None
    prompt_mismatch: bool = False


@dataclass(frozen=True, slots=True)
class DriftReport:
    reference: str
    candidate: str
    prompts: tuple[PromptDrift, ...]
    max_logprob_delta: float
    settings_mismatch: tuple[str, ...] = field(default_factory=tuple)

    @property
    def diverged(self) -> list[PromptDrift]:
        return [p for p in self.prompts if p.diverged_at is not None]

    @property
    def logprob_moved(self) -> list[PromptDrift]:
        return [
            p
            for p in self.prompts
            if p.max_abs_logprob_delta is not None and p.max_abs_logprob_delta > self.max_logprob_delta
        ]

    @property
    def flagged(self) -> bool:
        return bool(self.diverged or self.logprob_moved or self.settings_mismatch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "flagged": self.flagged,
            "diverged_prompts": len(self.diverged),
            "logprob_moved_prompts": len(self.logprob_moved),
        }


def _first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_answer(ref: Answer, cand: Answer) -> PromptDrift:
    mismatch = ref.prompt_sha256 != cand.prompt_sha256
    if ref.tokens and cand.tokens:
        at = _first_difference(ref.tokens, cand.tokens)
        upto = len(ref.tokens) if at is None else at
        upto = min(upto, len(cand.tokens))
        deltas = [abs(ref.logprobs[i] - cand.logprobs[i]) for i in range(upto)]
        drift = PromptDrift(
            ref.prompt_id,
            "token",
            len(ref.tokens),
            len(cand.tokens),
            at,
            max(deltas) if deltas else 0.0,
            sum(deltas) / len(deltas) if deltas else 0.0,
            prompt_mismatch=mismatch,
        )
        if at is not None and at < len(ref.tokens) and at < len(cand.tokens):
            top = ref.top[at] if at < len(ref.top) else ()
            gap = top[0].logprob - top[1].logprob if len(top) >= 2 else None
            in_top = any(t.token == cand.tokens[at] for t in top) if top else None
            drift = replace(
                drift,
                reference_token=ref.tokens[at],
                candidate_token=cand.tokens[at],
                reference_top2_gap=gap,
                candidate_token_in_reference_top=in_top,
            )
        return drift
    at = _first_difference(ref.text, cand.text)
    drift = PromptDrift(ref.prompt_id, "char", len(ref.text), len(cand.text), at, prompt_mismatch=mismatch)
    if at is not None and at < len(ref.text) and at < len(cand.text):
        drift = replace(drift, reference_token=ref.text[at], candidate_token=cand.text[at])
    return drift


def compare(ref: Answers, cand: Answers, max_logprob_delta: float = DEFAULT_MAX_LOGPROB_DELTA) -> DriftReport:
    """Every prompt both answered, candidate against reference."""
    if not (max_logprob_delta >= 0 and math.isfinite(max_logprob_delta)):
        raise ConfigError("max_logprob_delta must be a finite number >= 0")
    mismatch = tuple(
        f"{k}: {getattr(ref, k)!r} vs {getattr(cand, k)!r}"
        for k in ("model", "max_tokens", "seed")
        if getattr(ref, k) != getattr(cand, k)
    )
    theirs = cand.by_id()
    rows = tuple(compare_answer(a, theirs[a.prompt_id]) for a in ref.answers if a.prompt_id in theirs)
    mismatch += tuple(f"prompt {p.prompt_id}: different prompt text" for p in rows if p.prompt_mismatch)
    return DriftReport(ref.endpoint, cand.endpoint, rows, max_logprob_delta, mismatch)


def report_lines(r: DriftReport) -> list[str]:
    """A plain-text report: one line per prompt, then the verdict."""
    out = [f"{r.candidate} against {r.reference}:"]
    for p in r.prompts:
        if p.diverged_at is None:
            what = f"identical ({p.length_reference} {p.unit}s)"
        else:
            what = f"diverges at {p.unit} {p.diverged_at} of {p.length_reference}/{p.length_candidate}"
            if p.reference_token is not None:
                what += f": {p.reference_token!r} -> {p.candidate_token!r}"
            if p.reference_top2_gap is not None:
                what += f" (reference top-2 gap {p.reference_top2_gap:.4g}"
                what += ", a near tie)" if p.reference_top2_gap < NEAR_TIE_LOGPROB else ")"
        if p.max_abs_logprob_delta is not None:
            what += f"; |Δlogprob| before it max {p.max_abs_logprob_delta:.3g} mean {p.mean_abs_logprob_delta:.3g}"
        out.append(f"  {p.prompt_id}: {what}")
    for m in r.settings_mismatch:
        out.append(f"  settings differ: {m}")
    verdict = "DRIFT" if r.flagged else "no drift"
    out.append(
        f"  {verdict}: {len(r.diverged)} of {len(r.prompts)} prompts diverge, {len(r.logprob_moved)} with "
        f"|Δlogprob| > {r.max_logprob_delta:g} before any divergence"
    )
    return out
