"""How a (prefix, passage) pair becomes cross-encoder input — the one place that decides it.

Training (the collator in :mod:`reranking.data`) and evaluation (:class:`reranking.encoder_selectors.PredictiveSelector`)
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
from dataclasses import asdict, dataclass, fields
from typing import Sequence

import torch

from ralm.settings import EncoderInput, SettingsError


#: The text of the "no passage" candidate of a reranker that may abstain (what its encoder reads for it).
NO_PASSAGE = ""


@dataclass(frozen=True)
class InputFormat(EncoderInput):
    """An :class:`~ralm.settings.EncoderInput` with the architecture and the prior its scores get: all that
    evaluation needs to read a pair as training did. Saved with every export and checkpoint."""

    architecture: str = "cross"
    """``cross`` (one pair per encoder input) or ``bi`` (prefix and passage embedded separately)."""
    bm25_weight: float = 0.0
    """Score = f(x, d) + ``bm25_weight`` × the candidate's BM25 score: the first stage's ranking as a fixed
    prior that training learns a correction to (0: the paper's reranker, which sees the text alone)."""
    abstain: bool = False
    """Every list also holds "no passage" (:data:`NO_PASSAGE` as its text, BM25's first score as its prior),
    scored like a passage: trained on the LM's log-probability without a passage; chosen, the LM's window
    keeps its own first tokens. Off: the paper's reranker, which always retrieves."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "drop", tuple(self.drop))
        problems = []
        if self.architecture not in ("cross", "bi"):
            problems.append(f"architecture={self.architecture!r} must be 'cross' or 'bi' (--model.architecture)")
        if not 0 <= self.bm25_weight < float("inf"):
            problems.append(f"bm25_weight={self.bm25_weight} must be finite and >= 0 (--model.bm25_weight)")
        if self.architecture == "bi":
            if self.max_passage_tokens < 3:
                problems.append(f"max_passage_tokens={self.max_passage_tokens} must be >= 3 "
                                "(--model.input.max_passage_tokens)")
        elif self.max_length < 8:
            problems.append(f"max_length={self.max_length} is too small; use e.g. --model.input.max_length 512")
        elif self.max_prefix_tokens >= self.max_length - 4:
            problems.append(
                f"max_prefix_tokens={self.max_prefix_tokens} leaves no room for the passage within "
                f"max_length={self.max_length}; lower --model.input.max_prefix_tokens (e.g. to max_length // 2)")
        if problems:
            raise SettingsError("InputFormat: " + "; ".join(problems))

    @classmethod
    def of(cls, input: EncoderInput, architecture: str, bm25_weight: float = 0.0,
           abstain: bool = False) -> "InputFormat":
        """The format of a reranker of ``architecture`` that reads ``input``."""
        return cls(**asdict(input), architecture=architecture, bm25_weight=bm25_weight, abstain=abstain)

    @property
    def input(self) -> EncoderInput:
        """What the encoder reads, without the architecture and the prior."""
        return EncoderInput(**{f.name: getattr(self, f.name) for f in fields(EncoderInput)})

    @property
    def longest(self) -> int:
        """The most encoder positions one input takes."""
        return max(self.max_prefix_tokens, self.max_passage_tokens) if self.architecture == "bi" else self.max_length

    def with_no_passage(self, texts: list[str], bm25: list[float] | None) -> tuple[list[str], list[float] | None]:
        """A candidate list (texts, BM25 scores) as this reranker ranks it: with "no passage" last when it
        abstains (its prior BM25's first score, so the prior never prefers a passage to it)."""
        if not self.abstain or not texts:
            return texts, bm25
        return [*texts, NO_PASSAGE], (None if bm25 is None else [*bm25, bm25[0]])

    def with_bm25(self, scores: torch.Tensor, bm25: torch.Tensor) -> torch.Tensor:
        """``scores + bm25_weight * bm25`` (``scores`` unchanged when the weight is 0)."""
        return scores + self.bm25_weight * bm25.to(scores) if self.bm25_weight else scores

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "InputFormat":
        """Exports written before bi-encoders existed have no ``architecture``: they are cross-encoders."""
        known = {k: d[k] for k in ("max_length", "max_prefix_tokens", "architecture", "max_passage_tokens",
                                   "bm25_weight", "drop", "abstain") if k in d}
        return cls(**known)

    def encode(self, tokenizer, prefixes: Sequence[str], passages: Sequence[str], pair_prefix: Sequence[int],
               padding: str = "longest") -> dict[str, torch.Tensor]:
        """Model inputs for ``passages[j]`` paired with ``prefixes[pair_prefix[j]]``, in this format: the
        keys of :class:`~reranking.model.CrossEncoder` or :class:`~reranking.model.BiEncoder`."""
        prefixes, passages = without(prefixes, self.drop), without(passages, self.drop)
        if self.architecture == "cross":
            return encode_pairs(tokenizer, prefixes, passages, self, pair_prefix=pair_prefix, padding=padding)
        q = encode_texts(tokenizer, prefixes, self.max_prefix_tokens, "end")
        d = encode_texts(tokenizer, passages, self.max_passage_tokens, "start")
        return {"query_input_ids": q["input_ids"], "query_attention_mask": q["attention_mask"],
                "passage_input_ids": d["input_ids"], "passage_attention_mask": d["attention_mask"],
                "pair_query": torch.as_tensor(list(pair_prefix), dtype=torch.long)}

    def check_encoder(self, limit: int | None, name: str = "encoder") -> None:
        """Raise if the encoder cannot take the longest input (``limit``: its
        :func:`~reranking.model.max_input_tokens`; None: no limit known)."""
        if limit is not None and self.longest > limit:
            flag = ("max_length" if self.architecture == "cross" else
                    "max_prefix_tokens" if self.max_prefix_tokens >= self.max_passage_tokens else "max_passage_tokens")
            raise SettingsError(f"{flag}={getattr(self, flag)} exceeds what {name} supports ({limit} positions); set "
                                f"--model.input.{flag} {limit} or lower")


def without(texts: Sequence[str], drop: Sequence[str]) -> list[str]:
    """``texts`` with every occurrence of each ``drop`` string removed (:attr:`InputFormat.drop`)."""
    if not drop:
        return list(texts)
    out = []
    for t in texts:
        for s in drop:
            t = t.replace(s, "")
        out.append(t)
    return out


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
