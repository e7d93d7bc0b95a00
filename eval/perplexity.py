"""One evaluation of ``eval.ppl``: the text tokenized, finished chunks kept, the rest scored, the outputs written.

:func:`evaluate` checks every input before any heavy work, holds the output directory
(:func:`ralm.lock.claim`), resumes from the chunks a killed run left (``OUTPUT_DIR/work``; the run's identity
and the resume protocol are :mod:`eval.results`'), scores the pending chunks through Lightning
(:mod:`eval.predict`), with candidates from an index or a retrieval file (:mod:`eval.candidates`) and LM scores
reused from earlier runs where they are the same (:mod:`eval.reuse`), and writes the outputs.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from eval.candidates import FileCandidates, IndexCandidates, reference_entries_for
from eval.loop import assemble, check_ranking_window, make_chunks
from eval.predict import ChunkWriter, EvalModule, chunk_path, load_chunk, predict_chunks
from eval.rerankers import check_reranker, make_selector
from eval.results import default_output_dir, retrieval_identity, run_identity, start_state, write_outputs
from eval.reuse import ReusedScores
from ralm.articles import forbidden_titles, split_articles
from ralm.cli import quiet_libraries, quiet_lightning
from ralm.files import atomic_write, check_writable
from ralm.lock import claim
from ralm.precision import for_run
from ralm.progress import Progress
from ralm.retrieval import check_index, write_reference_json
from ralm.scoring import DocumentEncoder
from ralm.settings import Devices, InputError, Ranker, Retrieval, Scoring, SettingsError, Text, Windows, as_dict
from ralm.stage import Tokens, open_lm, tokenize_text
from ralm.text import word_count


def check_settings(*, reranker: str, windows: Windows, scoring: Scoring, trainer: Devices, chunk_strides: int,
                   reuse_from: list[str] | str | None, **_) -> None:
    """What is wrong in the settings alone, before any file is read (also the pipeline's check up front)."""
    if chunk_strides < 1:
        raise SettingsError(f"--chunk_strides must be >= 1 (got {chunk_strides})")
    trainer.kwargs(one_process=scoring.device_map is not None)  # a bad device combination fails before any work
    if reuse_from and reranker in ("zero-shot", "zero-shot-abstain"):
        raise SettingsError(f"--reuse_from: --reranker {reranker} ranks on the LM's NLL of the s' tokens before the "
                            "targets, which no run keeps, so there is nothing to reuse; leave --reuse_from out")
    if reranker in ("zero-shot", "zero-shot-abstain"):  # before the first chunk (the loop checks each batch again)
        check_ranking_window(windows.max_length, windows.zero_shot_tokens, windows.stride)


def evaluate(*, model: str, reranker: str, text: Text, retrieval: Retrieval, retrieval_file: str | None,
             windows: Windows, ranker: Ranker, scoring: Scoring, trainer: Devices, output_dir: str | None,
             cache_dir: str | None, save_retrieval_file: str | None, chunk_strides: int, seed: int, keep_work: bool,
             reuse_from: list[str] | str | None, verbose: bool, progress: bool) -> dict:
    """Retrieval-augmented perplexity of ``model`` with one reranker (``eval.ppl``'s settings); returns the
    results (``{}`` on a rank other than global rank 0)."""
    quiet_libraries(verbose)
    t0 = time.time()
    check_settings(reranker=reranker, windows=windows, scoring=scoring, trainer=trainer, chunk_strides=chunk_strides,
                   reuse_from=reuse_from)
    uses_docs = check_reranker(reranker, ranker)
    if uses_docs and not (retrieval.index or retrieval_file):
        raise InputError(f"--reranker {reranker} needs candidates: pass --retrieval.index or --retrieval_file")
    if uses_docs and not retrieval_file:
        check_index(retrieval.index)
    out = Path(output_dir) if output_dir else default_output_dir(reranker)
    check_writable(out, "--output_dir")
    reuse = (reuse_from,) if isinstance(reuse_from, str) else tuple(reuse_from or ())
    with claim(out, "--output_dir"):  # a second evaluation on the same directory is refused at once
        job = Job(model=model, reranker=reranker, ranker=ranker, seed=seed, windows=windows, scoring=scoring,
                  trainer=trainer, retrieval=retrieval, retrieval_file=retrieval_file, reuse_from=reuse,
                  verbose=verbose, progress=progress)
        return _evaluate(job, text, out, cache_dir, save_retrieval_file, chunk_strides, keep_work, t0)


@dataclass(frozen=True)
class Job:
    """The settings one evaluation runs with (``scoring.dtype`` resolved once the text is read)."""

    model: str
    reranker: str
    ranker: Ranker
    seed: int
    windows: Windows
    scoring: Scoring
    trainer: Devices
    retrieval: Retrieval
    retrieval_file: str | None
    reuse_from: tuple[str, ...]
    verbose: bool
    progress: bool

    @property
    def uses_docs(self) -> bool:
        return self.reranker != "none"


def _tokenize(job: Job, text: Text) -> Tokens:
    """The text as the LM reads it; refuses a text too short to measure retrieval."""
    tokens = tokenize_text(job.model, text, job.windows)
    if job.uses_docs:
        job.retrieval.check_windows(job.windows, tokens.max_length)
        if len(tokens.wins) < 2:
            raise InputError(f"--text ({text.describe()}) has {len(tokens.ids)} tokens, which fit in one "
                             f"{tokens.max_length}-token window: no stride would retrieve, so --reranker {job.reranker} "
                             "would measure no retrieval at all. Use a longer text or a smaller --windows.max_length")
    return tokens


def _evaluate(job: Job, text: Text, out: Path, cache_dir, save_retrieval_file, chunk_strides: int, keep_work: bool,
              t0: float) -> dict:
    """Score the chunks not finished yet (resuming), then assemble and write the outputs (global rank 0)."""
    tokens = _tokenize(job, text)
    setting = job.scoring.dtype
    precision = for_run(setting, job.trainer.accelerator)  # recorded resolved: it changes the numbers
    job = replace(job, scoring=replace(job.scoring, dtype=precision.dtype))
    identity = _identity(job, text, tokens, chunk_strides)
    done = start_state(out, identity)
    if done is not None:
        print(f"[eval.ppl] {out} already holds this evaluation (complete); nothing to do", file=sys.stderr)
        return done
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    atomic_write(work / "run.json", lambda t: Path(t).write_text(json.dumps(identity, indent=1, sort_keys=True)))

    chunks = make_chunks(tokens.wins, chunk_strides)
    finished = {c.index: r for c in chunks if (r := load_chunk(chunk_path(work / "chunks", c.index))) is not None}
    pending = [c for c in chunks if c.index not in finished]
    source_meta: dict = {}
    make_candidates = _candidate_source(job, tokens, Path(cache_dir) if cache_dir else out.parent / "retrieval_cache",
                                        source_meta)
    rank0, predict_seconds = True, None
    if pending:
        n_done = sum(len(c.windows) for c in chunks if c.index in finished)
        reuse = ReusedScores.load(job.reuse_from, identity) if job.reuse_from else None
        rank0, predict_seconds = _predict(job, tokens, pending, make_candidates if job.uses_docs else None, work,
                                          n_done, reuse)
    if not rank0:
        return {}
    if pending:
        print(f"[eval.ppl] scored with LM compute dtype {precision.describe(setting)}", file=sys.stderr)
    results = [finished.get(c.index) or load_chunk(chunk_path(work / "chunks", c.index)) for c in chunks]
    if any(r is None for r in results):
        raise InputError(f"{sum(r is None for r in results)} chunk(s) have no result after scoring; rerun the same "
                         "command to finish them")
    res = assemble(tokens.ids, tokens.wins, results)
    if job.uses_docs and not source_meta:
        make_candidates().close()  # every chunk was finished earlier: record where candidates came from
    if save_retrieval_file and job.uses_docs:
        _save_retrieval(save_retrieval_file, chunks, tokens.wins, tokens.ids, tokens.tokenizer, make_candidates)
    # Cost: seconds of scoring (retrieval, reranking and LM forwards; not start-up or loading) per 1,000
    # strides, when this process scored every stride (a resumed run's earlier part was not timed).
    n = len(tokens.wins)
    # A run that reused earlier LM scores did not pay for every forward: its time is no reranker's cost, only what
    # it spent itself (its ranking and the forwards nobody lent it; the report's lower bound).
    spent = round(1000 * predict_seconds / n, 2) if predict_seconds and len(pending) == len(chunks) else None
    cost = spent if not res.reused.any() else None
    meta = {"model": job.model, "max_length_used": tokens.max_length, "seconds": round(time.time() - t0, 2),
            "seconds_per_1000_strides": cost, "seconds_spent_per_1000_strides": spent,
            "precision": precision.describe(setting),
            "retrieval": source_meta, "reused_from": list(job.reuse_from),
            "settings": {"windows": as_dict(job.windows), "retrieval": as_dict(job.retrieval),
                         "scoring": as_dict(job.scoring), "ranker": as_dict(job.ranker)}}
    return _write(out, job, tokens, res, identity, meta, keep_work)


def _write(out: Path, job: Job, tokens: Tokens, res, identity: dict, meta: dict, keep_work: bool) -> dict:
    """results.json, strides.parquet, tokens.npz (:mod:`eval.results`); then ``work/`` goes unless kept."""
    results = write_outputs(out, res, reranker=job.reranker, n_words=word_count(tokens.body), identity=identity,
                            meta=meta, article=stride_articles(tokens.tokenizer, tokens.body, tokens.wins,
                                                               res.stride_index))
    if not keep_work:
        shutil.rmtree(out / "work", ignore_errors=True)
    return results


def _identity(job: Job, text: Text, tokens: Tokens, chunk_strides: int) -> dict:
    """What the results depend on (:func:`eval.results.run_identity`)."""
    return run_identity(model=job.model, reranker=job.reranker, text_source=text.describe(), body=tokens.body,
                        windows={**asdict(job.windows), "max_length_used": tokens.max_length,
                                 "row_start": DocumentEncoder(tokens.tokenizer, bos=job.windows.bos).describe()},
                        chunk_strides=chunk_strides, dtype=job.scoring.dtype, seed=job.seed,
                        ranker=asdict(job.ranker) if job.reranker in ("cosine", "zero-shot") else None,
                        retrieval=retrieval_identity(job.retrieval, job.retrieval_file) if job.uses_docs else None)


def _candidate_source(job: Job, tokens: Tokens, cache: Path, source_meta: dict):
    """A factory of the candidate source (a retrieval file, or the index with the evaluation's own titles
    forbidden); each source records where its candidates came from in ``source_meta``."""
    forbidden = set()
    if job.uses_docs and not job.retrieval_file and job.retrieval.forbid_eval_titles:
        forbidden = forbidden_titles(tokens.body)

    def make_candidates():
        if job.retrieval_file:
            src = FileCandidates(job.retrieval_file, tokens.wins, f"stride {job.windows.stride}, window {tokens.max_length}")
        else:
            src = IndexCandidates(job.retrieval, tokens.ids, tokens.tokenizer, forbidden, cache, verbose=job.verbose)
        source_meta.update(src.meta)
        return src

    return make_candidates


def _predict(job: Job, tokens: Tokens, pending, make_candidates, work: Path, n_done: int, reuse):
    """Score the pending chunks with Lightning; returns (True in the process that writes the outputs, seconds)."""
    quiet_lightning(job.verbose)
    lm = open_lm(job.model, job.scoring, work)
    selector = make_selector(job.reranker, job.ranker, job.model, job.seed, windows=job.windows,
                             max_length=tokens.max_length, scoring=job.scoring)
    name = job.reranker if len(job.reranker) < 20 else "predictive"
    bar = Progress(len(tokens.wins), f"ppl [{name}]", "strides", enabled=job.progress, initial=n_done)
    module = EvalModule(lm, selector, torch.as_tensor(tokens.ids, dtype=torch.long), tokens.tokenizer,
                        windows=job.windows, k=job.retrieval.k, scoring=job.scoring, reuse=reuse)
    rank0, seconds, _ = predict_chunks(module, pending, make_candidates, ChunkWriter(work / "chunks", bar),
                                       job.trainer)
    bar.close()
    return rank0, seconds


def stride_articles(tokenizer, body: str, wins, stride_index) -> "np.ndarray | None":
    """The article (0-based, in text order) of each stride's first scored token, for statistics that
    resample whole articles (eval.compare); None when the tokenizer gives no character offsets.

    Text before the first heading counts as an article only if it holds words: raw WikiText opens with a
    blank line, which would otherwise make the first stride a resampling unit of its own."""
    try:
        enc = tokenizer(body, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):
        return None
    starts = np.array([o[0] for o in enc["offset_mapping"]], dtype=np.int64)  # char start per token
    pieces, _ = split_articles(body)
    piece_start = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    if len(pieces) > 1 and not pieces[0].strip():
        piece_start = np.concatenate([[0], piece_start[2:]])           # the blank lead joins article 0
    token_article = np.searchsorted(piece_start, starts, side="right") - 1
    first_scored = np.array([wins[i].end - wins[i].trg_len for i in stride_index], dtype=np.int64)
    return token_article[np.minimum(first_scored, len(token_article) - 1)].astype(np.int32)


def _save_retrieval(path, chunks, wins, ids, tokenizer, make_candidates) -> None:
    src = make_candidates()
    try:
        queries, passages = [], []
        for c in chunks:
            if c.index == 0:
                queries.append("")
                passages.append([])
                continue
            queries += src.queries(c)
            passages += src.get(c)
    finally:
        src.close()
    write_reference_json(path, reference_entries_for(wins, ids, tokenizer, queries, passages))
