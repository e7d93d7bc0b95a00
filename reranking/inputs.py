"""How a (prefix, passage) pair becomes cross-encoder input — the one place that decides it.

Training (the collator in :mod:`reranking.data`) and evaluation (:class:`reranking.selector.PredictiveSelector`)
both call :func:`encode_pairs`, so the reranker always sees the same format:

``<s> prefix_tail </s></s> passage_head </s>`` (the encoder's own pair template), where

- the *prefix* (the LM context before the targets) is cut **from the left** to at most
  ``max_prefix_tokens`` encoder tokens: its end, next to the tokens to predict, matters most;
- the *passage* (``"title\\ntext"``, the exact string the LM was conditioned on) is cut **from the
  right** to whatever is left of ``max_length`` after the prefix and the special tokens.

Tokenization happens here, in the data pipeline, never in a training step. Batches are padded to
their longest pair (``padding="longest"``), or to ``max_length`` for comparison benchmarks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class InputFormat:
    """Input-format settings of a reranker; saved with every export so evaluation reproduces training."""

    max_length: int = 512
    """Total encoder tokens per pair, special tokens included (RoBERTa: at most 512)."""
    max_prefix_tokens: int = 256
    """Encoder tokens kept from the end of the prefix; the passage gets the rest of ``max_length``."""

    def __post_init__(self):
        problems = []
        if self.max_length < 8:
            problems.append(f"max_length={self.max_length} is too small; use e.g. --model.max_length 512")
        if self.max_prefix_tokens < 1:
            problems.append(f"max_prefix_tokens={self.max_prefix_tokens} must be >= 1")
        elif self.max_prefix_tokens >= self.max_length - 4:
            problems.append(
                f"max_prefix_tokens={self.max_prefix_tokens} leaves no room for the passage within "
                f"max_length={self.max_length}; lower --model.max_prefix_tokens (e.g. to max_length // 2)")
        if problems:
            raise ValueError("InputFormat: " + "; ".join(problems))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "InputFormat":
        known = {k: d[k] for k in ("max_length", "max_prefix_tokens") if k in d}
        return cls(**known)

    def check_encoder(self, max_position_embeddings: int | None, offset: int = 0, name: str = "encoder") -> None:
        """Raise if the encoder cannot take ``max_length`` positions (RoBERTa reserves 2 of its 514)."""
        if max_position_embeddings is not None and self.max_length > max_position_embeddings - offset:
            raise ValueError(
                f"max_length={self.max_length} exceeds what {name} supports "
                f"({max_position_embeddings - offset} positions); set --model.max_length "
                f"{max_position_embeddings - offset} or lower")


def _backend(tokenizer):
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(
            f"encode_pairs needs a fast (Rust-backed) tokenizer, got {type(tokenizer).__name__}; "
            "load it with AutoTokenizer.from_pretrained(name) (use_fast=True is the default)")
    return backend


def encode_pairs(tokenizer, prefixes: Sequence[str], passages: Sequence[str], fmt: InputFormat,
                 pair_prefix: Sequence[int] | None = None, padding: str = "longest") -> dict[str, torch.Tensor]:
    """Tokenize (prefix, passage) pairs into a padded batch.

    Args:
        tokenizer: the encoder's fast tokenizer (``AutoTokenizer.from_pretrained``).
        prefixes: ``P_x`` prefix strings.
        passages: ``N`` passage strings (``"title\\ntext"``).
        fmt: length budget (:class:`InputFormat`).
        pair_prefix: for each passage, the index of its prefix in ``prefixes`` (length ``N``);
            ``None`` means one prefix per passage (``P_x == N``). Each prefix is tokenized once.
        padding: ``"longest"`` (dynamic: pad to the longest pair of this batch) or ``"max_length"``.

    Returns:
        ``input_ids`` and ``attention_mask`` (plus ``token_type_ids`` if the tokenizer uses them),
        each ``LongTensor[N, T]`` with ``T <= fmt.max_length``.
    """
    if pair_prefix is None:
        if len(prefixes) != len(passages):
            raise ValueError(f"encode_pairs: got {len(prefixes)} prefixes and {len(passages)} passages; "
                             "pass pair_prefix to share prefixes between passages")
        pair_prefix = range(len(passages))
    elif len(pair_prefix) != len(passages):
        raise ValueError(f"encode_pairs: pair_prefix has {len(pair_prefix)} entries for {len(passages)} passages")
    if padding not in ("longest", "max_length"):
        raise ValueError(f"encode_pairs: padding must be 'longest' or 'max_length', got {padding!r}")
    backend = _backend(tokenizer)
    n_special = tokenizer.num_special_tokens_to_add(pair=True)
    # A previous ``tokenizer(..., padding=..., truncation=...)`` call may have left padding/truncation
    # switched on in the Rust backend; encode raw pieces without them, then restore the caller's state.
    padding_state, truncation_state = backend.padding, backend.truncation
    backend.no_padding()
    backend.no_truncation()
    try:
        pre_enc = backend.encode_batch(list(prefixes), add_special_tokens=False)
        pas_enc = backend.encode_batch(list(passages), add_special_tokens=False)
    finally:
        if padding_state is not None:
            backend.enable_padding(**padding_state)
        if truncation_state is not None:
            backend.enable_truncation(**truncation_state)
    for e in pre_enc:  # keep the END of the prefix
        e.truncate(fmt.max_prefix_tokens, direction="left")
    ids, types = [], []
    for j, p_enc in zip(pair_prefix, pas_enc):
        x_enc = pre_enc[j]
        budget = fmt.max_length - n_special - len(x_enc.ids)
        p_enc.truncate(max(budget, 0), direction="right")  # keep the START of the passage
        pair = backend.post_process(x_enc, p_enc, add_special_tokens=True)
        ids.append(pair.ids)
        types.append(pair.type_ids)
    T = fmt.max_length if padding == "max_length" else max((len(i) for i in ids), default=0)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(ids), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), T), dtype=torch.long)
    token_type_ids = torch.zeros((len(ids), T), dtype=torch.long)
    for r, (i, t) in enumerate(zip(ids, types)):
        input_ids[r, : len(i)] = torch.tensor(i, dtype=torch.long)
        attention_mask[r, : len(i)] = 1
        token_type_ids[r, : len(t)] = torch.tensor(t, dtype=torch.long)
    out = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "token_type_ids" in tokenizer.model_input_names:
        out["token_type_ids"] = token_type_ids
    return out
