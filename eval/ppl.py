"""``python -m eval.ppl``: retrieval-augmented perplexity with any reranker (docs/METHOD.md §2).

    python -m eval.ppl --reranker bm25          # paper settings: GPT-2, WikiText-103 test, BM25 over DPR
    python -m eval.ppl --config configs/ppl.yaml --reranker checkpoints/reranker/version_0/reranker
    python -m eval.ppl --model smollm2-135m --text.file eval.txt --retrieval.index corpus/index --reranker oracle
    python -m eval.ppl --config configs/ppl.yaml --reranker zero-shot --trainer.devices 8 --trainer.strategy ddp

Rerankers: none, bm25, random, zero-shot (the evaluated LM ranks, or ``--ranker.model``), oracle,
cosine (``--ranker.model``'s mean-pooled embeddings, no training), or the path of a trained reranker
(an export directory or a Lightning ``.ckpt`` of ``reranking.fit``).

The strides are scored in chunks through Lightning's ``Trainer.predict`` (one device, N devices and
several nodes are the same command with ``--trainer.*`` flags), and each chunk's result is saved
under ``OUTPUT_DIR/work`` as soon as it exists: rerunning the same command after a kill continues
where it stopped and gives bit-identical results. The outputs (results.json last, see
``eval/outputs.py``) replace nothing until they are complete; an output directory holding another
run's work or results is refused rather than overwritten.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ralm.settings import (
    WIKITEXT103_TEST,
    Devices,
    InputError,
    Retrieval,
    Scoring,
    SettingsError,
    Text,
    Windows,
    as_dict,
)
from ralm.stage import Tokens

BUILTIN_RERANKERS = ("none", "bm25", "first", "random", "zero-shot", "oracle", "cosine")


@dataclass(frozen=True)
class Ranker:
    """Settings of the rerankers that run a model of their own.

    Args:
        model: zero-shot: a separate causal LM that ranks (its tokenizer may differ; default: the evaluated
            LM). cosine: the sentence encoder (required), e.g. minilm-l6.
        prefix_tokens: cosine: encoder tokens kept from the end of the prefix.
        passage_tokens: cosine: encoder tokens kept from the start of the passage (to compare with a
            bi-encoder trained from the same encoder, use its ``max_prefix_tokens`` / ``max_passage_tokens``).
        batch_size: (prefix, passage) pairs per forward of a predictive or cosine reranker.
    """

    model: str | None = None
    prefix_tokens: int = 256
    passage_tokens: int = 256
    batch_size: int = 64

    def __post_init__(self) -> None:
        if min(self.prefix_tokens, self.passage_tokens, self.batch_size) < 1:
            raise SettingsError(f"invalid ranker settings: --ranker.prefix_tokens ({self.prefix_tokens}), "
                                f"--ranker.passage_tokens ({self.passage_tokens}) and --ranker.batch_size "
                                f"({self.batch_size}) must be >= 1")


def default_output_dir(reranker: str) -> Path:
    """``runs/ppl/<reranker>``: each reranker's evaluation in its own directory."""
    if reranker in BUILTIN_RERANKERS:
        return Path("runs/ppl") / reranker
    p = Path(reranker).resolve()
    return Path("runs/ppl") / f"predictive-{p.parent.name}-{p.name}".replace(".", "_")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def model_identity(spec: str) -> dict:
    """What the scores depend on in a model, cheaply: its config and its files' names and sizes."""
    from ralm.models import resolve

    r = resolve(spec)
    p = Path(r.path)
    if not p.is_dir():
        return {"spec": spec}
    files = {f.name: f.stat().st_size for f in sorted(p.iterdir()) if f.is_file()}
    cfg = (p / "config.json").read_text() if (p / "config.json").is_file() else ""
    return {"spec": spec, "path": str(p.resolve()), "gguf": r.gguf_file, "config": _digest(cfg), "files": _digest(files)}


def reranker_identity(reranker: str) -> dict:
    if reranker in BUILTIN_RERANKERS:
        return {"name": reranker}
    from eval.candidates import file_sha256

    p = Path(reranker)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file())
    return {"path": str(p.resolve()), "sha256": _digest({f.name: file_sha256(f) for f in files})}


def make_selector(reranker: str, ranker: Ranker, model: str, seed: int, *, windows: Windows, max_length: int,
                  scoring: Scoring):
    from ralm.selectors import BUILTIN, RandomCandidate, ZeroShotOtherLM

    if reranker == "random":
        return RandomCandidate(seed)
    if reranker == "cosine":
        from reranking.selector import CosineSelector

        return CosineSelector(ranker.model, prefix_tokens=ranker.prefix_tokens, passage_tokens=ranker.passage_tokens,
                              batch_size=ranker.batch_size)
    if reranker == "zero-shot" and ranker.model and ranker.model != model:
        from ralm.models import load_causal_lm
        from ralm.scoring import context_length

        zs_model, zs_tok = load_causal_lm(ranker.model, "cpu", role="--ranker.model")
        return ZeroShotOtherLM(zs_model, zs_tok, rank_tokens=windows.zero_shot_tokens,
                               doc_max_tokens=windows.doc_max_tokens, max_length=min(max_length, context_length(zs_model)),
                               batch_size=scoring.batch_size, dtype=scoring.dtype)
    if reranker in BUILTIN:
        return BUILTIN[reranker]()
    from reranking.selector import PredictiveSelector

    try:
        return PredictiveSelector.from_path(reranker, batch_size=ranker.batch_size)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        raise InputError(f"--reranker {reranker!r}: {e}") from None


def _check_reranker(reranker: str, ranker: Ranker) -> bool:
    """Cheap checks before any loading; returns whether the reranker reads retrieved documents."""
    if reranker not in BUILTIN_RERANKERS and not Path(reranker).exists():
        raise InputError(f"--reranker {reranker!r}: not one of {', '.join(BUILTIN_RERANKERS)} and no such file or "
                         "directory (a trained reranker is an export directory or a Lightning .ckpt of reranking.fit)")
    if reranker == "cosine" and not ranker.model:
        raise InputError("--reranker cosine needs --ranker.model (a sentence encoder, e.g. minilm-l6)")
    if reranker not in BUILTIN_RERANKERS:
        from reranking.export import check_reranker

        try:
            check_reranker(reranker)
        except InputError as e:
            raise InputError(f"--reranker: {e}") from None
    return reranker != "none"


def _start_state(out: Path, identity: dict) -> dict | None:
    """Refuse another run's directory; return the results if this very run is already complete."""
    from eval.outputs import RESULTS, read_complete

    work = out / "work" / "run.json"
    if work.is_file() and not any((out / "work" / "chunks").glob("*.npz")):
        work.unlink()  # a run that stopped before finishing any chunk left nothing to keep
    done = read_complete(out)
    if done is not None and done.get("identity") == identity:
        return done
    for what, path, other in (("results", out / RESULTS, done and done.get("identity")),
                              ("unfinished work", work, json.loads(work.read_text()) if work.is_file() else None)):
        if path.exists() and other != identity:
            if other is None:
                raise InputError(f"{path} exists but cannot be read as a finished run; delete {out} or pass "
                                 "another --output_dir")
            diff = sorted(k for k in set(other) | set(identity) if other.get(k) != identity.get(k))
            raise InputError(f"--output_dir {out} holds {what} of another evaluation (differs in: {', '.join(diff)}); "
                             f"pass another --output_dir, or delete {out} to start over")
    return None


def ppl(model: str = "gpt2", reranker: str = "bm25", text: Text = WIKITEXT103_TEST, retrieval: Retrieval = Retrieval(),
        retrieval_file: str | None = None, windows: Windows = Windows(), ranker: Ranker = Ranker(),
        scoring: Scoring = Scoring(), trainer: Devices = Devices(), output_dir: str | None = None,
        cache_dir: str | None = None, save_retrieval_file: str | None = None, chunk_strides: int = 64, seed: int = 0,
        keep_work: bool = False, reuse_from: list[str] | str | None = None, verbose: bool = False,
        progress: bool = True) -> dict:
    """Retrieval-augmented perplexity of a causal LM with one reranker.

    Args:
        model: The frozen causal LM: a short name (python -m ralm.models list), a local directory, a .gguf
            file or a hub id.
        reranker: none | bm25 | random | zero-shot | oracle | cosine | the path of a trained reranker.
        text: The evaluation text.
        retrieval: BM25 candidates (``retrieval.index``); unused with ``retrieval_file``.
        retrieval_file: Candidates from a reference-format retrieval JSON file instead of an index.
        windows: Stride, window, document budget and zero-shot's s'.
        ranker: Settings of rerankers with a model of their own (zero-shot with another LM, cosine, predictive).
        scoring: LM batch size, compute dtype, and the placement of an LM larger than one device.
        trainer: Lightning devices for the scoring (--trainer.devices 8 --trainer.strategy ddp).
        output_dir: Where the results go (default: runs/ppl/<reranker>).
        cache_dir: Retrieval cache (default: <output_dir>/../retrieval_cache, shared by sibling runs).
        save_retrieval_file: Also write the candidates used, in the reference's JSON format.
        chunk_strides: Strides per chunk: the unit of batching, of saved progress and of work per device.
        seed: Seed of the random reranker.
        keep_work: Keep OUTPUT_DIR/work (per-chunk results) after the run is complete.
        reuse_from: A finished run (or a list, ``'[DIR1,DIR2]'``) on the same text, LM, windows, precision
            and candidates, e.g. the bm25 run: a stride whose chosen passage is the one such a run chose
            takes that run's target NLLs instead of an LM forward (the same LM input; eval/reuse.py). A
            zero-shot or oracle run lends every candidate's (so an oracle reusing a zero-shot run, or any
            reranker reusing either, forwards almost nothing). Not for zero-shot itself.
        verbose: Show library and Java logging.
        progress: Show progress (a bar on a terminal, periodic lines otherwise).
    """
    from ralm.cli import quiet_libraries

    quiet_libraries(verbose)
    t0 = time.time()
    if chunk_strides < 1:
        raise SettingsError(f"--chunk_strides must be >= 1 (got {chunk_strides})")
    trainer.kwargs(one_process=scoring.device_map is not None)  # a bad device combination fails before any work
    uses_docs = _check_reranker(reranker, ranker)
    if reuse_from and reranker == "zero-shot":
        raise SettingsError("--reuse_from: --reranker zero-shot ranks on the LM's NLL of the s' tokens before the "
                            "targets, which no run keeps, so there is nothing to reuse; leave --reuse_from out")
    if uses_docs and not (retrieval.index or retrieval_file):
        raise InputError(f"--reranker {reranker} needs candidates: pass --retrieval.index or --retrieval_file")
    if uses_docs and not retrieval_file:
        from ralm.retrieval import check_index

        check_index(retrieval.index)
    out = Path(output_dir) if output_dir else default_output_dir(reranker)
    from ralm.files import check_writable

    check_writable(out, "--output_dir")
    from ralm.outputs import claim

    reuse = (reuse_from,) if isinstance(reuse_from, str) else tuple(reuse_from or ())
    with claim(out, "--output_dir"):  # a second evaluation on the same directory is refused at once
        job = _Job(model=model, reranker=reranker, ranker=ranker, seed=seed, windows=windows, scoring=scoring,
                   trainer=trainer, retrieval=retrieval, retrieval_file=retrieval_file, reuse_from=reuse,
                   verbose=verbose, progress=progress)
        return _evaluate(job, text, out, cache_dir, save_retrieval_file, chunk_strides, keep_work, t0)


@dataclass(frozen=True)
class _Job:
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


def _tokenize(job: _Job, text: Text) -> Tokens:
    """The text as the LM reads it; refuses a text too short to measure retrieval."""
    from ralm.stage import tokenize_text

    tokens = tokenize_text(job.model, text, job.windows)
    if job.uses_docs:
        job.retrieval.check_windows(job.windows, tokens.max_length)
        if len(tokens.wins) < 2:
            raise InputError(f"--text ({text.describe()}) has {len(tokens.ids)} tokens, which fit in one "
                             f"{tokens.max_length}-token window: no stride would retrieve, so --reranker {job.reranker} "
                             "would measure no retrieval at all. Use a longer text or a smaller --windows.max_length")
    return tokens


def _evaluate(job: _Job, text: Text, out: Path, cache_dir, save_retrieval_file, chunk_strides: int, keep_work: bool,
              t0: float) -> dict:
    """Score the chunks not finished yet (resuming), then assemble and write the outputs (global rank 0)."""
    from eval.loop import assemble, make_chunks
    from eval.predict import chunk_path, load_chunk
    from ralm.files import atomic_write
    from ralm.precision import for_run

    tokens = _tokenize(job, text)
    setting = job.scoring.dtype
    precision = for_run(setting, job.trainer.accelerator)  # recorded resolved: it changes the numbers
    job = replace(job, scoring=replace(job.scoring, dtype=precision.dtype))
    identity = _identity(job, text, tokens, chunk_strides)
    done = _start_state(out, identity)
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
        from eval.reuse import ReusedScores

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
    # A run that reused earlier LM scores did not pay for every forward: its time is no reranker's cost.
    cost = (round(1000 * predict_seconds / n, 2) if predict_seconds and len(pending) == len(chunks)
            and not res.reused.any() else None)
    meta = {"model": job.model, "max_length_used": tokens.max_length, "seconds": round(time.time() - t0, 2),
            "seconds_per_1000_strides": cost, "precision": precision.describe(setting),
            "retrieval": source_meta, "reused_from": list(job.reuse_from),
            "settings": {"windows": as_dict(job.windows), "retrieval": as_dict(job.retrieval),
                         "scoring": as_dict(job.scoring), "ranker": as_dict(job.ranker)}}
    return _write(out, job, tokens, res, identity, meta, keep_work)


def _write(out: Path, job: _Job, tokens: Tokens, res, identity: dict, meta: dict, keep_work: bool) -> dict:
    """results.json, strides.parquet, tokens.npz (:mod:`eval.outputs`); then ``work/`` goes unless kept."""
    from eval.outputs import write_outputs
    from ralm.text import word_count

    results = write_outputs(out, res, reranker=job.reranker, n_words=word_count(tokens.body), identity=identity,
                            meta=meta, article=stride_articles(tokens.tokenizer, tokens.body, tokens.wins,
                                                               res.stride_index))
    if not keep_work:
        import shutil

        shutil.rmtree(out / "work", ignore_errors=True)
    return results


def _identity(job: _Job, text: Text, tokens: Tokens, chunk_strides: int) -> dict:
    """What the results depend on: a rerun with the same identity resumes, another one is refused."""
    return {
        "model": model_identity(job.model), "reranker": reranker_identity(job.reranker),
        "text": {"source": text.describe(), "sha256": hashlib.sha256(tokens.body.encode()).hexdigest()},
        "windows": {**asdict(job.windows), "max_length_used": tokens.max_length}, "chunk_strides": chunk_strides,
        "dtype": job.scoring.dtype, "seed": job.seed,
        "ranker": asdict(job.ranker) if job.reranker in ("cosine", "zero-shot") else None,
        "retrieval": _retrieval_identity(job.retrieval, job.retrieval_file) if job.uses_docs else None,
    }


def _candidate_source(job: _Job, tokens: Tokens, cache: Path, source_meta: dict):
    """A factory of the candidate source (a retrieval file, or the index with the evaluation's own titles
    forbidden); each source records where its candidates came from in ``source_meta``."""
    forbidden = set()
    if job.uses_docs and not job.retrieval_file and job.retrieval.forbid_eval_titles:
        from ralm.corpus import forbidden_titles

        forbidden = forbidden_titles(tokens.body)

    def make_candidates():
        from eval.candidates import FileCandidates, IndexCandidates

        if job.retrieval_file:
            src = FileCandidates(job.retrieval_file, tokens.wins, f"stride {job.windows.stride}, window {tokens.max_length}")
        else:
            src = IndexCandidates(job.retrieval, tokens.ids, tokens.tokenizer, forbidden, cache, verbose=job.verbose)
        source_meta.update(src.meta)
        return src

    return make_candidates


def _retrieval_identity(retrieval: Retrieval, retrieval_file: str | None) -> dict:
    if retrieval_file:
        from eval.candidates import file_sha256

        if not Path(retrieval_file).is_file():
            raise InputError(f"--retrieval_file {retrieval_file!r} does not exist")
        return {"file": str(Path(retrieval_file).resolve()), "sha256": file_sha256(retrieval_file),
                "k": retrieval.k}
    from ralm.retrieval import index_identity

    return {**asdict(retrieval), "index": index_identity(retrieval.index)}


def _predict(job: _Job, tokens: Tokens, pending, make_candidates, work: Path, n_done: int, reuse):
    """Score the pending chunks with Lightning; returns (True in the process that writes the outputs, seconds)."""
    import torch

    from eval.predict import ChunkWriter, EvalModule, predict_chunks
    from ralm.cli import quiet_lightning
    from ralm.progress import Progress
    from ralm.stage import open_lm

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
    import numpy as np

    from ralm.corpus import split_articles

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
    from eval.candidates import reference_entries_for
    from ralm.retrieval import write_reference_json

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


def _report(results: dict, kwargs: dict) -> int:
    if results:
        from eval.outputs import markdown_table

        print(markdown_table(results))
        out = kwargs.get("output_dir") or default_output_dir(kwargs.get("reranker", "bm25"))
        print(f"results: {Path(out) / 'results.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(ppl, argv, "python -m eval.ppl", description=__doc__, after=_report)


if __name__ == "__main__":
    sys.exit(main())
