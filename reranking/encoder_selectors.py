"""Rerankers that rank with an encoder, as selectors of the evaluation loop (``ralm.selectors.Selector``):
the trained reranker (:class:`PredictiveSelector`) and the untrained sentence encoder (:class:`CosineSelector`)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

import torch

from ralm.loading import load_tokenizer
from ralm.retrieval import Passage
from ralm.selectors import Selector, StrideBatch
from ralm.settings import EncoderInput
from reranking.export import load_reranker
from reranking.inputs import InputFormat, encode_texts, without
from reranking.model import BiEncoder, max_input_tokens


class PredictiveSelector(Selector):
    """Picks ``argmax_j f(prefix, candidate_j)`` per stride with a trained reranker (``-1`` if none).

    Inputs are built exactly as in training (:meth:`reranking.inputs.InputFormat.encode` with the
    export's format, cross- or bi-encoder) and scored in micro-batches of ``batch_size`` pairs.
    """

    name = "predictive"
    lm_ranking = None  # needs no generator scores

    def __init__(self, model, tokenizer, fmt: InputFormat, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"PredictiveSelector: batch_size={batch_size} must be >= 1")
        self.abstains = fmt.abstain  # "no passage" is one more candidate, last
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.batch_size = batch_size
        # A bi-encoder's score is cosine / τ: the cosine ranker's code, with its passage-embedding cache
        # (the same passages come back stride after stride; re-embedding them was most of the time).
        self._cosine = (CosineSelector(model=model, tokenizer=tokenizer, input=fmt.input, batch_size=batch_size)
                        if fmt.architecture == "bi" else None)

    @classmethod
    def from_path(cls, path: str | Path, device: str | torch.device = "cpu", batch_size: int = 64) -> "PredictiveSelector":
        """Load from an export directory or a Lightning ``.ckpt`` of :class:`reranking.system.RerankerSystem`."""
        model, tokenizer, fmt = load_reranker(path, device=device)
        return cls(model, tokenizer, fmt, batch_size=batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def share_passage_embeddings(self, caches: dict) -> None:
        """Take the passage-embedding cache of another bi-encoder reranker with the same passage tower from
        ``caches`` (keyed by the tower's weights), or lend it this one's: query-side fits keep their starting
        encoder's tower, so rerankers judged together embed each passage once."""
        if self._cosine is None:
            return
        tower = self.model.passage_encoder if self.model.frozen_passages else self.model.encoder
        h = hashlib.sha256()
        for name, t in sorted(tower.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().float().cpu().numpy().tobytes())
        self._cosine._cache = caches.setdefault(h.hexdigest(), self._cosine._cache)

    def to(self, device) -> "PredictiveSelector":
        self.model.to(device)
        return self

    @torch.inference_mode()
    def scores(self, batch: StrideBatch) -> list[torch.Tensor]:
        """f(x_i, d_ij) (+ the BM25 prior, as trained) for every stride i: a float32 CPU tensor of length
        ``len(batch.candidates[i])``, one more (last: "no passage") for a reranker that abstains."""
        lists = [[*c, *self._no_passage(c)] for c in batch.candidates]
        found = self._text_scores(StrideBatch(batch.prefix_texts, lists, batch.stride_ids))
        if not self.fmt.bm25_weight:
            return found
        return [self.fmt.with_bm25(s, torch.tensor([p.score for p in c], dtype=torch.float32))
                for s, c in zip(found, lists)]

    def _no_passage(self, cands: list) -> list[Passage]:
        """The "no passage" candidate of a list, as training read it (:meth:`InputFormat.with_no_passage`)."""
        if not cands:
            return []
        texts, bm25 = self.fmt.with_no_passage([p.document() for p in cands], [p.score for p in cands])
        return [Passage("", "", text, score) for text, score in zip(texts[len(cands):], bm25[len(cands):])]

    def _text_scores(self, batch: StrideBatch) -> list[torch.Tensor]:
        if self._cosine is not None:
            return [c / self.model.temperature for c in self._cosine.scores(batch)]
        pairs = [(i, p.document()) for i, cands in enumerate(batch.candidates) for p in cands]
        flat = torch.empty(len(pairs), dtype=torch.float32)
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start: start + self.batch_size]
            used = sorted({i for i, _ in chunk})
            where = {i: j for j, i in enumerate(used)}
            enc = self.fmt.encode(self.tokenizer, [batch.prefix_texts[i] for i in used], [d for _, d in chunk],
                                  [where[i] for i, _ in chunk])
            enc = {k: v.to(self.device) for k, v in enc.items()}
            flat[start: start + len(chunk)] = self.model(**enc).float().cpu()
        return list(torch.split(flat, [len(c) for c in batch.candidates]))

    def select(self, batch: StrideBatch, lm_nll: torch.Tensor | None = None) -> list[int]:
        # "no passage" (the last score of an abstaining reranker's list) is -1, as no candidate
        return [int(s.argmax()) if len(s) and int(s.argmax()) < len(c) else -1
                for s, c in zip(self.scores(batch), batch.candidates)]

    def rank(self, prefix: str, passages: list) -> tuple[list[float], list[int]]:
        """Library use: the scores f(prefix, passage) and the passages' indices best first. A passage is
        a ``ralm.retrieval.Passage`` or a string (``"title\ntext"``, as the reranker was trained on); a
        reranker trained with ``bm25_weight`` adds the Passage's ``score`` (BM25) times it, 0 for a string
        (and "no passage" gets the first passage's). A reranker that may abstain adds the score of "no
        passage" last and ranks it as index -1: passages ranked after it are ones it would not take."""
        cands = [p if isinstance(p, Passage) else Passage("", "", str(p), 0.0) for p in passages]
        scores = self.scores(StrideBatch([prefix], [cands], [0]))[0].tolist()
        order = sorted(range(len(scores)), key=lambda j: -scores[j])
        return scores, [j if j < len(cands) else -1 for j in order]


class CosineSelector(Selector):
    """A sentence encoder used as it was trained: cosine of mean-pooled prefix and passage embeddings.

    The baseline that shows what LM-supervised fine-tuning adds: the same pretrained encoder the
    predictive reranker starts from (e.g. all-MiniLM-L6-v2), with no training on LM scores. It reads what
    ``input`` says (:class:`~ralm.settings.EncoderInput`): the prefix cut from the left to
    ``max_prefix_tokens``, the passage from the right to ``max_passage_tokens``, the ``drop`` strings removed.
    Passage embeddings are cached: the same passages come back stride after stride.
    """

    name = "cosine"

    def __init__(self, encoder: str | None = None, input: EncoderInput = EncoderInput(), batch_size: int = 64,
                 device: str | torch.device = "cpu", cache_size: int = 100_000, *, model=None, tokenizer=None):
        """``encoder``: a sentence encoder to load (pretrained); or pass a loaded ``model``
        (:class:`~reranking.model.BiEncoder`) and its ``tokenizer``, as a trained bi-encoder does."""
        # BiEncoder.embed is the one pooling in the project
        self.model = model.eval() if model is not None else BiEncoder(encoder, pretrained=True).eval().to(device)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(encoder)
        limit = max_input_tokens(self.model.config) or 512
        self.prefix_tokens = min(input.max_prefix_tokens, limit)
        self.passage_tokens = min(input.max_passage_tokens, limit)
        self.batch_size = batch_size
        self.drop = tuple(input.drop)
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._cache_size = cache_size

    def to(self, device) -> "CosineSelector":
        self.model.to(device)
        return self

    @torch.inference_mode()
    def embed(self, texts: list[str], max_tokens: int, keep: str, passages: bool = False) -> torch.Tensor:
        """L2-normalised mean-pooled last hidden states, ``FloatTensor[len(texts), H]`` on CPU; ``passages``:
        by the model's passage tower (:meth:`reranking.model.BiEncoder.embed`)."""
        device = next(self.model.parameters()).device
        texts = without(texts, self.drop)
        out = []
        for s in range(0, len(texts), self.batch_size):
            enc = encode_texts(self.tokenizer, texts[s:s + self.batch_size], max_tokens, keep)
            out.append(self.model.embed(enc["input_ids"].to(device), enc["attention_mask"].to(device),
                                        passages=passages).cpu())
        return torch.cat(out) if out else torch.empty(0, self.model.config.hidden_size)

    def _passages(self, docs: list[str]) -> torch.Tensor:
        """``[len(docs), H]``: the passages not cached yet are embedded together, in batches of ``batch_size``."""
        missing = [d for d in dict.fromkeys(docs) if d not in self._cache]
        new = dict(zip(missing, self.embed(missing, self.passage_tokens, "start", passages=True)))
        out = torch.stack([new[d] if d in new else self._cache[d] for d in docs])
        self._cache.update(new)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return out

    def scores(self, batch: StrideBatch) -> list[torch.Tensor]:
        """Cosine similarity of each stride's prefix with each of its candidates. The batch's passages are
        embedded in one go: stride by stride, the demo's 685 new passages took 387 forwards of ~2 each."""
        used = [i for i, c in enumerate(batch.candidates) if c]
        out = [torch.empty(0) for _ in batch.candidates]
        if not used:
            return out
        q = self.embed([batch.prefix_texts[i] for i in used], self.prefix_tokens, "end")
        d = self._passages([p.document() for i in used for p in batch.candidates[i]])
        for i, d_i, q_i in zip(used, d.split([len(batch.candidates[i]) for i in used]), q):
            out[i] = d_i @ q_i
        return out

    def select(self, batch: StrideBatch, lm_nll: torch.Tensor | None = None) -> list[int]:
        return [int(s.argmax()) if len(s) else -1 for s in self.scores(batch)]
