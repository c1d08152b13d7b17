"""Generate a tiny random-weight GGUF model that llama.cpp's ``llama-server`` loads and serves.

Deterministic: the same :class:`ModelSpec` (seed included) gives byte-identical files. Size is
selectable (:data:`PRESETS`), so a test chooses its latency: ``tiny`` (~130k parameters: prefill of 64
tokens < 1 ms, ~5,000 tok/s decode on one 2-core EPYC VM), ``small`` (~24M, F16: ~500 tok/s),
``medium`` (~270M, F16: ~45 tok/s).

Architecture ``llama`` with a SentencePiece-style vocabulary: ``<unk>`` ``<s>`` ``</s>``, ChatML
``<|im_start|>``/``<|im_end|>``, the 256 byte tokens, ``▁`` and printable ASCII, plus a ChatML chat
template so ``/v1/chat/completions`` works. Weights are random (std = gain/sqrt(fan_in)), except one
residual channel that is constant in every token embedding and one output column that reads it: it
favours printable tokens and pushes specials, bytes and EOS down, so completions are printable ASCII
and run to ``max_tokens`` (send ``"logit_bias": {"2": 100}`` to force an immediate stop).

Run ``python tests/llamacpp_model.py OUT.gguf --preset small --seed 1`` to write one by hand.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

EOS_ID = 2
BYTE_OFFSET = 5  # <0x00> is token 5

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Hyper-parameters of a generated model; ``f16`` stores the 2-D weights as float16."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    n_ctx: int = 2048
    f16: bool = False
    seed: int = 0
    gain: float = 1.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def key(self) -> str:
        """A short content key for caching generated files."""
        return hashlib.sha256(repr(sorted(asdict(self).items())).encode()).hexdigest()[:16]


PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(),
    "small": ModelSpec(n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1408, f16=True),
    "medium": ModelSpec(n_embd=1024, n_layer=24, n_head=16, n_head_kv=4, n_ff=2816, f16=True),
}


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (gguf TokenType values) of the generated SentencePiece vocabulary."""
    normal, unknown, control, byte = 1, 2, 3, 6
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [unknown, control, control, control, control]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [byte] * 256
    tokens.append("▁")
    types.append(normal)
    tokens += [chr(c) for c in range(0x21, 0x7F)]
    types += [normal] * (0x7F - 0x21)
    scores = [0.0 if t != normal else -float(i) for i, t in enumerate(types)]
    return tokens, scores, types


def _printable_mask(types: list[int]) -> np.ndarray:
    """True for tokens a completion should produce: ``▁`` and printable ASCII, plus the printable bytes."""
    mask = np.array([t == 1 for t in types])
    for b in range(0x20, 0x7F):
        mask[BYTE_OFFSET + b] = True
    return mask


def generate(path: Path, spec: ModelSpec = PRESETS["tiny"]) -> Path:
    """Write the GGUF model described by ``spec`` to ``path`` (overwritten) and return ``path``."""
    import gguf

    if spec.n_embd % spec.n_head or spec.n_head % spec.n_head_kv:
        raise ValueError("n_embd must divide by n_head and n_head by n_head_kv")
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    wtype = np.float16 if spec.f16 else np.float32
    kv_dim = spec.head_dim * spec.n_head_kv

    def weight(rows: int, cols: int) -> np.ndarray:
        # numpy shape is the reverse of GGML's ne: a (rows, cols) array multiplies a vector of length cols.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (spec.gain / np.sqrt(cols))).astype(wtype)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    bias_channel = spec.n_embd - 1
    embd = rng.standard_normal((n_vocab, spec.n_embd), dtype=np.float32) * 0.5
    embd[:, bias_channel] = 4.0 * np.sqrt(spec.n_embd)  # constant channel: survives every layer and the final norm
    output = weight(n_vocab, spec.n_embd).astype(np.float32)
    output[:, bias_channel] = np.where(_printable_mask(types), 0.05, -0.5)

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"inferwatch-random-{spec.key()}")
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(1 if spec.f16 else 0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(EOS_ID)
    w.add_eot_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    w.add_tensor("token_embd.weight", embd.astype(wtype))
    for i in range(spec.n_layer):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", ones(spec.n_embd))
        w.add_tensor(f"{p}.attn_q.weight", weight(spec.n_embd, spec.n_embd))
        w.add_tensor(f"{p}.attn_k.weight", weight(kv_dim, spec.n_embd))
        w.add_tensor(f"{p}.attn_v.weight", weight(kv_dim, spec.n_embd))
        out = weight(spec.n_embd, spec.n_embd)
        out[bias_channel, :] = 0  # keep the constant channel constant
        w.add_tensor(f"{p}.attn_output.weight", out)
        w.add_tensor(f"{p}.ffn_norm.weight", ones(spec.n_embd))
        w.add_tensor(f"{p}.ffn_gate.weight", weight(spec.n_ff, spec.n_embd))
        w.add_tensor(f"{p}.ffn_up.weight", weight(spec.n_ff, spec.n_embd))
        down = weight(spec.n_embd, spec.n_ff)
        down[bias_channel, :] = 0
        w.add_tensor(f"{p}.ffn_down.weight", down)
    w.add_tensor("output_norm.weight", ones(spec.n_embd))
    w.add_tensor("output.weight", output.astype(wtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cached(directory: Path, spec: ModelSpec) -> Path:
    """Generate ``spec`` into ``directory`` once (content-keyed file name) and return its path."""
    path = directory / f"inferwatch-{spec.key()}.gguf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        generate(tmp, spec)
        tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    spec = replace(PRESETS[args.preset], seed=args.seed)
    generate(args.out, spec)
    print(f"{args.out}: {args.out.stat().st_size} bytes ({args.preset}, seed {args.seed})")


if __name__ == "__main__":
    main()
