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

from contextlib import contextmanager
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
            from ralm.settings import SettingsError

            raise SettingsError("InputFormat: " + "; ".join(problems))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "InputFormat":
        known = {k: d[k] for k in ("max_length", "max_prefix_tokens") if k in d}
        return cls(**known)

    def check_encoder(self, max_position_embeddings: int | None, offset: int = 0, name: str = "encoder") -> None:
        """Raise if the encoder cannot take ``max_length`` positions (RoBERTa reserves 2 of its 514)."""
        if max_position_embeddings is not None and self.max_length > max_position_embeddings - offset:
            from ralm.settings import SettingsError

            raise SettingsError(
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


@contextmanager
def _raw(backend):
    """The backend with its own padding and truncation off, restored afterwards.

    A tokenizer file may switch them on (all-MiniLM-L6-v2's pads every encoding to 128 tokens): left on,
    ``post_process`` would pad each pair *before* our length budget and padding, and the padding would
    count as text in the attention mask.
    """
    padding_state, truncation_state = backend.padding, backend.truncation
    backend.no_padding()
    backend.no_truncation()
    try:
        yield backend
    finally:
        if padding_state is not None:
            backend.enable_padding(**padding_state)
        if truncation_state is not None:
            backend.enable_truncation(**truncation_state)


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
    n_special = tokenizer.num_special_tokens_to_add(pair=True)
    features = []
    with _raw(_backend(tokenizer)) as backend:
        pre_enc = backend.encode_batch(list(prefixes), add_special_tokens=False)
        pas_enc = backend.encode_batch(list(passages), add_special_tokens=False)
        for e in pre_enc:  # keep the END of the prefix
            e.truncate(fmt.max_prefix_tokens, direction="left")
        for j, p_enc in zip(pair_prefix, pas_enc):
            x_enc = pre_enc[j]
            budget = fmt.max_length - n_special - len(x_enc.ids)
            p_enc.truncate(max(budget, 0), direction="right")  # keep the START of the passage
            pair = backend.post_process(x_enc, p_enc, add_special_tokens=True)
            features.append({"input_ids": pair.ids, "token_type_ids": pair.type_ids})
    return _pad(tokenizer, features, fmt.max_length if padding == "max_length" else None)


def _pad(tokenizer, features: list[dict], length: int | None) -> dict[str, torch.Tensor]:
    """``tokenizer.pad`` to the longest row (or ``length``): ``LongTensor[N, T]`` input ids, attention mask
    and, for encoders that use them (BERT), token type ids."""
    keep = [k for k in ("input_ids", "token_type_ids") if k == "input_ids" or k in tokenizer.model_input_names]
    if not features:
        return {k: torch.zeros((0, 0), dtype=torch.long) for k in keep + ["attention_mask"]}
    batch = tokenizer.pad([{k: f[k] for k in keep if k in f} for f in features],
                          padding="max_length" if length else "longest", max_length=length, return_tensors="pt",
                          return_attention_mask=True)
    return {k: v.long() for k, v in batch.items()}


def encode_texts(tokenizer, texts: Sequence[str], max_tokens: int, keep: str = "start") -> dict[str, torch.Tensor]:
    """Tokenize single texts (with the encoder's special tokens) into a batch padded to its longest.

    ``keep="end"`` cuts a text from the left (a prefix: its end matters most), ``"start"`` from the
    right (a passage). ``max_tokens`` counts the special tokens. Used by bi-encoder rankers, which
    embed prefix and passage separately.
    """
    if keep not in ("start", "end"):
        raise ValueError(f"encode_texts: keep must be 'start' or 'end', got {keep!r}")
    room = max_tokens - tokenizer.num_special_tokens_to_add(pair=False)
    if room < 1:
        raise ValueError(f"encode_texts: max_tokens={max_tokens} leaves no room for text")
    features = []
    with _raw(_backend(tokenizer)) as backend:
        for e in backend.encode_batch(list(texts), add_special_tokens=False):
            e.truncate(room, direction="left" if keep == "end" else "right")
            features.append({"input_ids": backend.post_process(e, None, add_special_tokens=True).ids})
    out = _pad(tokenizer, features, None)
    out.pop("token_type_ids", None)
    return out
