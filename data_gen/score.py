"""Stage "score": log p(y | d_j ; x) for every candidate and log p(y | x), through Lightning.

A scoring step takes a *chunk* of examples of one shard and scores all their rows in one
:class:`ralm.scoring.LMScorer` call: for each example its ``n_candidates`` document rows (the
document's tokens overwrite the window's first positions, METHOD §2.4) and one row without a
document; with m targets per window (``--targets.per_window``), the rows of each window, whose m
examples each read their target's log-probabilities from them. :class:`ScoreWriter` (a ``BasePredictionWriter``) writes each step's results to
``work/scores/shard-NNNNN/ids-FIRSTID.npz`` keyed by the example ids carried *in the batch*, so the
same command works on 1 device, N devices (DDP) or several nodes: each rank writes the chunks it
was given, whatever order or padding its sampler used. A chunk file is written atomically; on
resume, the examples found in chunk files are not scored again. A chunk whose shard is still being
retrieved (stage "retrieve" runs beside the scoring) waits for it.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pyarrow.parquet as pq
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader, Dataset

from ralm.cli import quiet_lightning
from ralm.loading import load_tokenizer
from ralm.precision import for_run
from ralm.progress import Progress
from ralm.scoring import DocumentEncoder, LMScorer, attach_lm
from ralm.stage import open_lm, predict
from ralm.windows import window_ending_at

from .config import RunConfig, log
from .shards import Layout, done_ids, wait_for_shard, write_chunk


class ChunkDataset(Dataset):
    """Item i = one scoring step: the rows of a chunk of examples of one shard, in whole windows.

    Returns ``{"shard": int, "ids": (B,) long, "counts": (B,) long, "inputs": (R, L) long, "labels": (R, L) long,
    "slot_rows": (S,) long, "slot_targets": (S,) long}``. A window's rows are its candidates' ``[d ; window]``
    then one row without a document; with one target per window, an example's candidates in rank order. With
    m targets (``per_window``) the window's candidates are the union of its examples' lists, each passage once.
    Slot t (S = sum(counts + 1), in :func:`data_gen.shards.read_scores`' order: each example's candidates, then
    its no-document slot) reads target ``slot_targets[t]`` (0 .. m-1) of row ``slot_rows[t]``. Tokenizer and
    token file are opened lazily (spawn-worker safe).
    """
    def __init__(self, chunks: list[tuple[int, list[int]]], retrieved: dict[int, str], tokens_path: str,
                 tokenizer_name: str, window: int, stride: int, doc_max_tokens: int, failed_path: str = "",
                 per_window: int = 1, bos: str = "every_row"):
        self.chunks = chunks
        self.retrieved = retrieved
        self.failed_path = failed_path
        self.tokens_path = tokens_path
        self.tokenizer_name = tokenizer_name
        self.window, self.stride, self.doc_max_tokens = window, stride, doc_max_tokens
        self.per_window = per_window
        self.bos = bos
        self._ids = None
        self._encoder = None
        self._shard = (None, None)

    def __len__(self) -> int:
        return len(self.chunks)

    def _rows(self, shard: int) -> dict[int, dict]:
        if self._shard[0] != shard:
            wait_for_shard(Path(self.retrieved[shard]), Path(self.failed_path))
            t = pq.read_table(self.retrieved[shard], columns=["id", "position", "doc_texts"]).to_pylist()
            self._shard = (shard, {r["id"]: r for r in t})
        return self._shard[1]

    def __getitem__(self, i: int) -> dict:
        if self._ids is None:
            self._ids = np.load(self.tokens_path, mmap_mode="r")
            self._encoder = DocumentEncoder(load_tokenizer(self.tokenizer_name), self.doc_max_tokens, bos=self.bos)
        shard, ids = self.chunks[i]
        rows = self._rows(shard)
        m = self.per_window
        windows, docs, counts, slot_rows, slot_targets = [], [], [], [], []
        for w in range(0, len(ids), m):
            group = [rows[ex] for ex in ids[w:w + m]]  # one window's examples, its last target last
            win = window_ending_at(int(group[-1]["position"]), self.stride, self.window)
            tokens = torch.from_numpy(np.asarray(self._ids[win.begin:win.end], dtype=np.int64))
            first = len(docs)
            if m == 1:  # one row per candidate slot, as the paper's data (a passage listed twice scores twice)
                texts = list(group[0]["doc_texts"] or [])
                row_of = [[first + j for j in range(len(texts))]]
            else:
                texts = list(dict.fromkeys(t for r in group for t in (r["doc_texts"] or [])))
                where = {t: first + j for j, t in enumerate(texts)}
                row_of = [[where[t] for t in (r["doc_texts"] or [])] for r in group]
            enc = self._encoder(texts) if texts else []
            nodoc = first + len(enc)
            windows += [tokens] * (len(enc) + 1)
            docs += list(enc) + [None]
            for j, cand in enumerate(row_of):
                slot_rows += cand + [nodoc]
                slot_targets += [j] * (len(cand) + 1)
                counts.append(len(cand))
        labels = torch.stack(windows)  # (R, L)
        inputs = self._encoder.condition(labels, docs)  # (R, L): documents (or a BOS) overwrite the first positions
        return {"shard": shard, "ids": torch.tensor(ids, dtype=torch.long),
                "counts": torch.tensor(counts, dtype=torch.long), "inputs": inputs, "labels": labels,
                "slot_rows": torch.tensor(slot_rows, dtype=torch.long),
                "slot_targets": torch.tensor(slot_targets, dtype=torch.long)}


def unwrap(items: list[dict]) -> dict:
    """collate_fn for batch_size=1: a dataset item already is a batch."""
    return items[0]


class LMScoringModule(pl.LightningModule):
    """A frozen causal LM whose ``predict_step`` returns each example slot's summed target log-probs."""
    def __init__(self, model: torch.nn.Module, stride: int, batch_size: int = 64, dtype: str = "auto",
                 per_window: int = 1):
        super().__init__()
        attach_lm(self, model)  # not in hparams: the LM is passed in, not rebuilt
        self.stride = stride
        self.per_window = per_window
        self.batch_size = batch_size
        self.compute_dtype = dtype
        self.scorer: LMScorer | None = None

    def on_predict_start(self) -> None:
        # Built here, after Lightning moved the module to its device (LMScorer reads the device once).
        self.scorer = LMScorer(self.lm, batch_size=self.batch_size, dtype=self.compute_dtype)

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        m, s = self.per_window, self.stride
        nll = self.scorer.nll(batch["inputs"], batch["labels"], m * s)  # (R, m*s) float32 on CPU
        per_target = -nll.view(-1, m, s).sum(dim=2)  # (R, m): log p(y_j | d; x_j) of each target j, float32
        return {"shard": int(batch["shard"]), "ids": batch["ids"].cpu(), "counts": batch["counts"].cpu(),
                "logprobs": per_target[batch["slot_rows"].cpu(), batch["slot_targets"].cpu()],  # (S,)
                "rows": nll.size(0)}


class ScoreWriter(BasePredictionWriter):
    """Writes each step's results as ``scores/shard-NNNNN/ids-FIRSTID.npz``, keyed by the batch's ids, with
    the compute ``dtype`` that produced them (a resumed job may run on another machine, where ``auto``
    resolves differently; the shard records every dtype its chunks were scored in).

    ``shard_done(s)`` is called (on global rank 0) when the steps move past shard ``s``, so that finished
    shards become final parquet files while later ones are scored: a long job's data is usable, and can
    be copied or committed, shard by shard."""
    def __init__(self, scores_root: str | Path, progress=None, shard_done=None, dtype: str = "unrecorded"):
        super().__init__(write_interval="batch")
        self.root = Path(scores_root)
        self.progress = progress
        self.shard_done = shard_done
        self.dtype = dtype
        self._shard = None
        self.examples = self.rows = 0  # this rank's: the LM rows its examples cost

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx=0) -> None:
        ids = prediction["ids"].numpy()
        write_chunk(self.root / f"shard-{prediction['shard']:05d}", ids, prediction["counts"].numpy(),
                    prediction["logprobs"].numpy(), self.dtype)
        self.examples += len(ids)
        self.rows += prediction["rows"]
        if self.progress is not None:
            self.progress.update(len(ids))
        shard = int(prediction["shard"])
        if self._shard is not None and shard != self._shard and self.shard_done and trainer.is_global_zero:
            self.shard_done(self._shard)
        self._shard = shard


def pending_chunks(layout, batch_examples: int, first_shards: int | None = None) -> list[tuple[int, list[int]]]:
    """(shard, example ids) scoring steps still to do: unfinished shards (of the first ``first_shards``) minus ids
    found in chunk files. A step holds whole windows (m examples each; chunk files hold whole windows), at least
    one."""
    m = layout.build.targets.per_window
    step = max(batch_examples // m, 1) * m
    chunks = []
    for s in range(min(layout.build.n_shards, first_shards or layout.build.n_shards)):
        if layout.shard(s).exists():
            continue
        done = done_ids(layout.scores(s))
        todo = [i for i in layout.build.shard_ids(s) if i not in done]
        chunks += [(s, todo[j:j + step]) for j in range(0, len(todo), step)]
    return chunks


def run_score(layout: Layout, run: RunConfig, window: int, rank0: bool, n_total: int, shard_done=None) -> bool:
    """Score the pending chunks with Lightning; returns True in the process that writes the dataset."""
    quiet_lightning(run.verbose)
    build = layout.build
    chunks = pending_chunks(layout, run.batch_examples, run.first_shards)
    if not chunks:
        return rank0
    n_ex = sum(len(c[1]) for c in chunks)
    precision = for_run(run.scoring.dtype, run.trainer.accelerator)
    if rank0:
        m, k = build.targets.per_window, build.retrieval.k
        per_window = (k if build.targets.candidates == "shared" else m * k) + 1
        log(f"[score] {n_ex:,} example(s) in {len(chunks):,} step(s) of <= {len(chunks[0][1])} examples ({m} per "
            f"window: <= {len(chunks[0][1]) // m * per_window} LM rows of {window} tokens); LM compute dtype "
            f"{precision.describe(run.scoring.dtype)}")
    model = open_lm(build.model, run.scoring, layout.work)
    shards = sorted({s for s, _ in chunks})
    dataset = ChunkDataset(chunks, {s: str(layout.retrieved(s)) for s in shards}, str(layout.tokens), build.model,
                           window, build.windows.stride, build.windows.doc_max_tokens, str(layout.retrieve_failed),
                           build.targets.per_window, build.windows.bos)
    loader = DataLoader(dataset, batch_size=1, shuffle=False, collate_fn=unwrap, num_workers=run.num_workers,
                        multiprocessing_context="spawn" if run.num_workers > 0 else None,
                        persistent_workers=run.num_workers > 0)
    module = LMScoringModule(model, stride=build.windows.stride, batch_size=run.scoring.batch_size,
                             dtype=precision.dtype, per_window=build.targets.per_window)
    bar = Progress(n_total, "score", "examples", enabled=run.progress and rank0, initial=n_total - n_ex)
    writer = ScoreWriter(layout.scores_dir, bar, shard_done, dtype=precision.dtype)
    is_zero, dt, world = predict(module, loader, writer, run.trainer, run.scoring, "data_gen.score")
    bar.close()
    if is_zero and writer.examples:
        rows = writer.rows / writer.examples  # LM rows per example (this rank's: the same recipe on every rank)
        log(f"[score] {n_ex:,} examples in {dt:.1f}s: {n_ex / dt:,.1f} examples/s, {rows:.2f} LM rows of {window} "
            f"tokens per example, {n_ex * rows * window / dt:,.0f} LM tokens/s (world size {world})")
    return is_zero
