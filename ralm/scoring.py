"""The frozen causal LM as a scorer: NLL of target tokens given ``[document ; window]``.

METHOD §2.4: the tokenized document *overwrites the first positions* of the window; labels stay the
original window tokens. Everything that is expensive lives here, so the speed levers are here too:

* only the positions whose log-probabilities are needed go through the LM head
  (``logits_to_keep``), which is most of the cost for small models with a 50k vocabulary;
* many (window, document) rows go through one forward — no per-candidate Python loop;
* log-softmax is taken in float32 whatever the compute dtype (bf16 autocast where it is native).

Rows are scored in micro-batches of ``batch_size``; a row's result does not depend on which other
rows share its micro-batch (no padding is ever used: rows of one call have equal length).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Sequence

import torch

from ralm.precision import resolve as resolve_precision
from ralm.settings import Windows


def resolve_device(device: str | None = None) -> torch.device:
    """``None``/"auto" → CUDA when present, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def autocast_for(device: torch.device, dtype: str = "auto"):
    """The one place that turns a precision setting into an autocast context.

    "auto": bf16 autocast where the device runs bf16 natively (:mod:`ralm.precision`), plain float32
    elsewhere; "float32": never autocast; "bfloat16"/"float16": autocast to that dtype.
    """
    choice = resolve_precision(dtype, device.type)
    if choice.dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, choice.dtype))


def context_length(model_or_config) -> int:
    """The maximum context of a model or of its config (GPT-2: ``n_positions``)."""
    cfg = getattr(model_or_config, "config", model_or_config)
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(cfg, attr, None):
            return int(getattr(cfg, attr))
    raise ValueError(f"cannot tell the context length of {type(cfg).__name__}; pass max_length explicitly")


def bos_token(tokenizer) -> int | None:
    """The BOS id ``tokenizer`` puts before every text (Gemma, Llama: its ``add_bos_token``, or a post-processor
    template), None where it adds none (GPT-2, SmolLM2), found by what it returns for a text."""
    bos = tokenizer.bos_token_id
    special = tokenizer("x")["input_ids"]
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    return bos if bos is not None and special[:1] == [bos] and plain[:1] != [bos] else None


class DocumentEncoder:
    """What goes before a window: a passage tokenized as the reference does, or a row's start without one.

    A passage: ``tokenizer(doc, max_length=budget, truncation=True)``: special tokens included (none for
    GPT-2, BOS for e.g. Llama), cut from the right; cached, since the same passages come back stride after
    stride. A row without a passage starts with :attr:`empty`: ``[BOS]`` where the tokenizer adds one and
    ``bos`` is ``every_row`` (so every row starts with exactly one BOS), else nothing (``passage``: the
    reference, where only a passage brings one). :meth:`condition` writes both into windows.
    """
    def __init__(self, tokenizer, max_tokens: int = Windows.doc_max_tokens, cache_size: int = 200_000,
                 bos: str = Windows.bos):
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size
        token = bos_token(tokenizer) if bos == "every_row" else None
        self.empty: list[int] = [] if token is None else [token]

    def __call__(self, documents: Sequence[str]) -> list[list[int]]:
        missing = [d for d in dict.fromkeys(documents) if d not in self._cache]
        if missing:
            enc = self.tokenizer(missing, max_length=self.max_tokens, truncation=True)["input_ids"]
            for d, ids in zip(missing, enc):
                self._cache[d] = list(ids)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return [self._cache[d] for d in documents]

    def condition(self, windows: torch.Tensor, documents: Sequence[Sequence[int] | None]) -> torch.Tensor:
        """:func:`condition_on_documents`, a row without a document (None or empty) starting with :attr:`empty`."""
        return condition_on_documents(windows, [d if d else self.empty for d in documents])

    def describe(self) -> str:
        """What the results record of the row start."""
        if self.empty:
            return f"every row starts with BOS (token {self.empty[0]})"
        token = bos_token(self.tokenizer)
        return ("the tokenizer adds no BOS" if token is None
                else f"BOS (token {token}) only through a passage (--windows.bos passage)")


def condition_on_documents(windows: torch.Tensor, documents: Sequence[Sequence[int] | None]) -> torch.Tensor:
    """Rows of ``[document ; window]`` of the window's length: document ids overwrite the first positions.

    windows:   (R, W) long — the original window of each row (rows may repeat one window k times)
    documents: R token-id lists (``None`` or empty = no document for that row)
    returns:   (R, W) long — a new tensor; ``windows`` is not modified
    """
    if windows.dim() != 2 or windows.size(0) != len(documents):
        raise ValueError(f"windows must be (R, W) with R = len(documents) = {len(documents)}, got {tuple(windows.shape)}")
    out = windows.clone()
    width = out.size(1)
    for r, doc in enumerate(documents):
        if doc:
            n = min(len(doc), width)  # a document longer than the window fills it (the reference would crash)
            out[r, :n] = torch.as_tensor(doc[:n], dtype=out.dtype)
    return out


def input_device(model) -> torch.device:
    """Where a model's inputs go: its parameters' device, or for a model placed by ``device_map`` the
    first device of the map that computes (disk-offloaded layers are streamed to where they run)."""
    placed = getattr(model, "hf_device_map", None)
    if placed:
        for d in placed.values():
            if d not in ("disk", "meta"):
                return torch.device(f"cuda:{d}" if isinstance(d, int) else d)
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return next(model.parameters()).device


def attach_lm(module: torch.nn.Module, lm: torch.nn.Module) -> None:
    """``module.lm = lm`` for a LightningModule; a model placed by ``device_map`` is kept out of the module
    tree, so that Lightning moving ``module`` to its device leaves the placement (GPUs, CPU, disk) alone."""
    if getattr(lm, "hf_device_map", None):
        object.__setattr__(module, "lm", lm)
    else:
        module.lm = lm


class LMScorer:
    """Batched per-token NLL of the last ``n`` tokens of equal-length rows under a frozen LM."""
    def __init__(self, model, batch_size: int = 16, dtype: str = "auto"):
        self.model = model
        self.batch_size = batch_size
        self.device = input_device(model)
        self.dtype = dtype

    @torch.inference_mode()
    def nll(self, inputs: torch.Tensor, labels: torch.Tensor, n_last: int) -> torch.Tensor:
        """NLL (nats, float32, CPU) of ``labels[:, W - n_last:]`` given ``inputs``.

        inputs: (R, W) long — what the LM reads (documents already written in)
        labels: (R, W) long — the original tokens; only the last ``n_last`` columns are scored
        returns (R, n_last) float32; column j is the NLL of ``labels[:, W - n_last + j]``
        """
        if inputs.shape != labels.shape or inputs.dim() != 2:
            raise ValueError(f"inputs {tuple(inputs.shape)} and labels {tuple(labels.shape)} must be equal (R, W)")
        rows, width = inputs.shape
        if not 1 <= n_last < width:
            raise ValueError(f"n_last must be in [1, W-1] = [1, {width - 1}], got {n_last}")
        out = torch.empty(rows, n_last, dtype=torch.float32)
        for start in range(0, rows, self.batch_size):
            x = inputs[start:start + self.batch_size].to(self.device, non_blocking=True)
            y = labels[start:start + self.batch_size, width - n_last:].to(self.device, non_blocking=True)
            with autocast_for(self.device, self.dtype):
                # logits at positions W-n_last-1 .. W-1; the last one predicts beyond the window.
                logits = self.model(input_ids=x, logits_to_keep=n_last + 1, use_cache=False).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), dim=-1)  # (b, n_last, V) in float32
            # (a model spread by device_map returns its logits on its last device)
            out[start:start + x.size(0)] = -logp.gather(-1, y.to(logp.device).unsqueeze(-1)).squeeze(-1).cpu()
        return out
