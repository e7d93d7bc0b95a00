"""The strided loop on Lightning: ``Trainer.predict`` over chunks of strides, each result persisted.

* :class:`StrideChunks` yields this rank's pending chunks (``pending[rank::world]``) with their
  candidates and prefix texts; it asks the candidate source for the next ``prefetch`` chunks before
  handing out the current one, so BM25 for the next chunks runs (in the search process) while the LM
  scores this one.
* :class:`EvalModule` scores a chunk (:func:`eval.loop.score_chunk`) on whatever device Lightning
  put it.
* :class:`ChunkWriter` writes each chunk's result to ``work/chunks/chunk-NNNNNNN.npz`` atomically, so
  a killed run resumes at the first missing chunk, and N devices or nodes each write the chunks they
  scored (the same pattern as data generation).
* :func:`run_loop` is the same path in one call on in-memory candidates (tests, benchmarks).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import IterableDataset

from eval.loop import (
    CandidateFn,
    Chunk,
    ChunkInput,
    ChunkResult,
    LoopResult,
    assemble,
    make_chunks,
    prefix_texts,
    score_chunk,
)
from ralm.cli import quiet_lightning
from ralm.files import atomic_write
from ralm.retrieval import Passage
from ralm.scoring import DocumentEncoder, LMScorer, attach_lm
from ralm.selectors import Selector
from ralm.settings import Devices, Retrieval, Scoring, Windows
from ralm.stage import predict
from ralm.windows import stride_windows

if TYPE_CHECKING:
    from eval.reuse import ReusedScores

CHUNK_KEYS = ("stride_index", "stride_nll", "stride_n_tokens", "chosen_rank", "n_candidates", "token_nll", "reused",
              "cand_stride", "cand_n_tokens", "cand_nll")


def chunk_path(chunks_dir: Path, index: int) -> Path:
    return chunks_dir / f"chunk-{index:07d}.npz"


def save_chunk(path: Path, res: ChunkResult) -> None:
    """One chunk's result (``ralm.files.atomic_write``); passages as JSON bytes (no pickle)."""
    chosen = [None if p is None else [p.docid, p.title, p.text, p.score, p.contents] for p in res.chosen]

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # an open file: np.savez would append ".npz" to a bare name
            np.savez(f, **{k: getattr(res, k) for k in CHUNK_KEYS},
                     chosen=np.frombuffer(json.dumps(chosen).encode(), dtype=np.uint8),
                     cand_docid=np.frombuffer(json.dumps(res.cand_docid).encode(), dtype=np.uint8))

    atomic_write(path, write)


def load_chunk(path: Path) -> ChunkResult | None:
    """A saved chunk, or ``None`` if the file is missing or unreadable (then it is scored again)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in CHUNK_KEYS}
            chosen = json.loads(z["chosen"].tobytes().decode())
            cand_docid = json.loads(z["cand_docid"].tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError):
        return None
    passages = [None if c is None else Passage(docid=c[0], title=c[1], text=c[2], score=c[3], contents=c[4])
                for c in chosen]
    if not (len(passages) == len(arrays["stride_index"]) == len(arrays["stride_nll"])
            and int(arrays["stride_n_tokens"].sum()) == len(arrays["token_nll"])
            and len(cand_docid) == len(arrays["cand_stride"]) == len(arrays["cand_n_tokens"])
            and int(arrays["cand_n_tokens"].sum()) == len(arrays["cand_nll"])):
        return None
    return ChunkResult(**arrays, chosen=passages, cand_docid=cand_docid)


def world() -> tuple[int, int]:
    """(rank, world size) of this process (0, 1 when not distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class StrideChunks(IterableDataset):
    """This rank's pending chunks as ready-to-score items (``batch_size=None``: an item is a chunk)."""
    def __init__(self, ids: torch.Tensor, chunks: Sequence[Chunk], tokenizer, selector: Selector,
                 make_candidates: Callable[[], object] | None, prefetch: int = 2):
        self.ids, self.chunks, self.tokenizer, self.selector = ids, list(chunks), tokenizer, selector
        self.make_candidates, self.prefetch = make_candidates, prefetch

    def __iter__(self):
        rank, size = world()
        mine = self.chunks[rank::size]
        source = self.make_candidates() if (self.make_candidates and self.selector.uses_documents) else None
        try:
            for i, chunk in enumerate(mine):
                if source is not None:
                    for ahead in mine[i:i + 1 + self.prefetch]:
                        if ahead.index > 0:
                            source.prefetch(ahead)
                run = list(chunk.windows)
                wins = torch.stack([self.ids[w.begin:w.end] for w in run])
                if chunk.index == 0:
                    cands, prefixes = [[]], [""]
                else:
                    cands = source.get(chunk) if source is not None else [[] for _ in run]
                    prefixes = prefix_texts(self.tokenizer, wins, run[0].trg_len, self.selector)
                yield ChunkInput(chunk, cands, prefixes)
        finally:
            if source is not None:
                source.close()


class EvalModule(pl.LightningModule):
    """A frozen causal LM (and the selector's own model, if any) scoring chunks of strides; ``reuse``
    holds target NLLs an earlier run computed for the same LM inputs (:mod:`eval.reuse`)."""
    def __init__(self, lm: torch.nn.Module, selector: Selector, ids: torch.Tensor, tokenizer, *, windows: Windows,
                 k: int, scoring: Scoring, reuse: "ReusedScores | None" = None):
        super().__init__()
        attach_lm(self, lm)  # not in hparams: passed in, not rebuilt
        self.selector, self.ids, self.tokenizer = selector, ids, tokenizer
        self.docs = DocumentEncoder(tokenizer, windows.doc_max_tokens, bos=windows.bos)
        self.zero_shot_tokens, self.k, self.scoring, self.reuse = windows.zero_shot_tokens, k, scoring, reuse
        self.scorer: LMScorer | None = None

    def on_predict_start(self) -> None:
        # After Lightning moved the LM to its device: the scorer reads the device once, and the selector's
        # own model (reranker, ranking LM) follows the LM there.
        self.scorer = LMScorer(self.lm, batch_size=self.scoring.batch_size, dtype=self.scoring.dtype)
        self.selector.to(self.device)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # an item holds no tensors: the windows are cut from ``self.ids`` in the step

    def predict_step(self, item: ChunkInput, batch_idx: int = 0) -> ChunkResult:
        return score_chunk(self.ids, item, self.scorer, self.selector, self.docs,
                           zero_shot_tokens=self.zero_shot_tokens, k=self.k, reuse=self.reuse)


class ChunkWriter(BasePredictionWriter):
    """Persists each chunk's result as soon as it is scored; reports progress in strides."""

    def __init__(self, chunks_dir: Path, progress=None):
        super().__init__(write_interval="batch")
        self.dir = Path(chunks_dir)
        self.progress = progress

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx=0) -> None:
        save_chunk(chunk_path(self.dir, batch.chunk.index), prediction)
        if self.progress is not None:
            self.progress.update(len(batch.chunk.windows))


def unbatched(item):
    return item


class _ListedCandidates:
    """A candidate source over in-memory passages: ``candidates(windows)`` -> passages per window."""
    def __init__(self, candidates: CandidateFn):
        self.candidates = candidates

    def prefetch(self, chunk: Chunk) -> None:
        pass

    def get(self, chunk: Chunk) -> list[list[Passage]]:
        return self.candidates(list(chunk.windows))

    def close(self) -> None:
        pass


def predict_chunks(module: EvalModule, chunks: Sequence[Chunk], make_candidates, writer: "ChunkWriter",
                   devices: Devices):
    """Score ``chunks`` in one ``Trainer.predict`` (``ralm.stage``), each result written by ``writer``:
    the one path of ``eval.ppl`` and :func:`run_loop`. Returns (is_global_zero, seconds, world_size)."""
    data = torch.utils.data.DataLoader(StrideChunks(module.ids, chunks, module.tokenizer, module.selector,
                                                    make_candidates), batch_size=None, collate_fn=unbatched)
    return predict(module, data, writer, devices, module.scoring, "eval.predict")


def run_loop(ids: Sequence[int], tokenizer, lm: torch.nn.Module, selector: Selector,
             candidates: CandidateFn | None = None, *, windows: Windows = Windows(), scoring: Scoring = Scoring(),
             k: int = Retrieval.k, strides_per_chunk: int = 64, devices: Devices = Devices(devices=1)) -> LoopResult:
    """Score every target token of ``ids`` the way ``python -m eval.ppl`` does: its chunks, its
    :class:`StrideChunks` and :class:`EvalModule` in one ``Trainer.predict`` (``ralm.stage``), each chunk
    written by :class:`ChunkWriter` and read back, then assembled. ``candidates`` maps windows to their
    allowed passages; required unless the selector uses no documents."""
    quiet_lightning(False)
    if selector.uses_documents and candidates is None:
        raise ValueError(f"the {selector.name!r} reranker needs retrieval: pass candidates")
    ids_t = torch.as_tensor(list(ids), dtype=torch.long)
    wins = stride_windows(len(ids_t), windows.stride, windows.max_length)
    chunks = make_chunks(wins, strides_per_chunk)
    source = (lambda: _ListedCandidates(candidates)) if candidates is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        module = EvalModule(lm, selector, ids_t, tokenizer, windows=windows, k=k, scoring=scoring)
        predict_chunks(module, chunks, source, ChunkWriter(Path(tmp)), devices)
        results = [load_chunk(chunk_path(Path(tmp), c.index)) for c in chunks]
    return assemble(ids_t.tolist(), wins, results)
