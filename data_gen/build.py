"""``python -m data_gen.build``: the predictive reranker's training set, supervised by a frozen LM.

    python -m data_gen.build --config configs/build.yaml                       # paper settings, 300k examples
    python -m data_gen.build --config configs/build.yaml --trainer.devices 8 --trainer.strategy ddp
    python -m data_gen.build --model smollm2-135m --text.file train.txt --eval_text.file eval.txt \\
        --retrieval.index corpus/index --windows.max_length 256 --windows.doc_max_tokens 96 --examples 1000 --out data

Each example is a prefix x of the training text (the window's first L - s tokens), its next s tokens
y, the BM25 top-k passages d_1..d_k for the query made of x's last ℓ tokens (never from x's own
article nor from the forbidden evaluation articles), and log p(y | d_j ; x) for every j plus
log p(y | x). The stages (sample → retrieve → score → write shards) work in shards and resume after
a kill; BM25 for later shards runs in its own process while earlier shards are scored; re-running a
finished job checks its shards against the manifest and does nothing else. The result is
``OUT/*.parquet`` (schema ``ralm.schema.TRAINING_SCHEMA``; ``datasets.load_dataset("parquet",
data_files="OUT/*.parquet")``) plus ``OUT/manifest.json``.

Scoring runs through Lightning's ``Trainer.predict``: ``--trainer.devices 8 --trainer.strategy ddp``
spreads it over GPUs; several nodes: run ``--stage retrieve`` once first (shared filesystem).
"""

from __future__ import annotations

import json
import shutil
import sys
import time

from ralm.settings import (
    WIKITEXT103_TEST,
    WIKITEXT103_TRAIN,
    Devices,
    Retrieval,
    Scoring,
    Text,
    Windows,
)
from ralm.windows import window_ending_at

from .config import BuildConfig, BuildError, RunConfig


def _log(msg: str) -> None:
    print(f"[data_gen] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# inputs, checked before anything is written


def check_model(build: BuildConfig):
    """The LM's tokenizer and its effective window L, after the causal-LM and vocabulary checks."""
    from ralm.models import ModelError, check_causal_lm, load_config, load_tokenizer
    from ralm.scoring import context_length

    try:
        tok, cfg = load_tokenizer(build.model), load_config(build.model)
        check_causal_lm(build.model, cfg, tok)
    except ModelError as e:
        raise BuildError(str(e) if "--model" in str(e) else f"--model: {e}") from None
    window = build.windows.fitted(context_length(cfg))
    build.retrieval.check_windows(build.windows, window)
    return tok, window


def _load(text: Text, what: str) -> str:
    try:
        return text.load()
    except (FileNotFoundError, ValueError) as e:
        raise BuildError(f"--{what}: {e}") from None


def forbidden_from_eval(build: BuildConfig) -> set[str]:
    from ralm.corpus import forbidden_titles

    if not (build.retrieval.forbid_eval_titles and build.eval_text.given):
        return set()
    titles = forbidden_titles(_load(build.eval_text, "eval_text"))
    if not titles:
        raise BuildError("the evaluation text has no ` = Title = ` headings, so no title can be forbidden; pass a "
                         "WikiText-layout --eval_text.file, or --eval_text.dataset null to forbid nothing")
    return titles


# ---------------------------------------------------------------------------------------------
# stages


def stage_sample(layout, build: BuildConfig, tokenizer, window: int, write: bool):
    """Token ids of the training text and the sampled example positions (cached in work/)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .sample import sample_positions, tokenize_text
    from .shards import atomic_save_npy, atomic_write_parquet, store_config

    if layout.tokens.exists() and layout.samples.exists():
        return np.load(layout.tokens, mmap_mode="r"), pq.read_table(layout.samples)
    if not write:
        raise BuildError(f"{layout.samples} is missing on a non-zero rank: run `--stage retrieve` once (single "
                         "process) before a multi-node scoring run")
    text = _load(build.text, "text")
    t0 = time.perf_counter()
    tok = tokenize_text(tokenizer, text)
    _log(f"[sample] {build.text.describe()}: {len(text):,} chars -> {len(tok.ids):,} tokens, {len(tok.titles):,} "
         f"articles in {time.perf_counter() - t0:.1f}s")
    positions = sample_positions(len(tok.ids), build.examples, window, build.windows.stride, build.seed)
    samples = pa.table({"id": np.arange(build.examples, dtype=np.int64), "position": positions,
                        "source_title": tok.title_at(positions)})
    store_config(layout)  # every input passed: from here on the directory holds this dataset
    atomic_save_npy(layout.tokens, tok.ids)
    atomic_write_parquet(layout.samples, samples)
    return np.load(layout.tokens, mmap_mode="r"), samples


def pending_chunks(layout, batch_examples: int) -> list[tuple[int, list[int]]]:
    """(shard, example ids) scoring steps still to do: unfinished shards minus ids found in chunk files."""
    from .score import done_ids

    chunks = []
    for s in range(layout.build.n_shards):
        if layout.shard(s).exists():
            continue
        done = done_ids(layout.scores(s))
        todo = [i for i in layout.build.shard_ids(s) if i not in done]
        chunks += [(s, todo[j:j + batch_examples]) for j in range(0, len(todo), batch_examples)]
    return chunks


def assemble_shard(layout, s: int, tokens, tokenizer, window: int) -> bool:
    """Write final shard ``s`` from its retrieval and score files if all its examples are scored."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ralm.schema import TRAINING_SCHEMA

    from .score import read_scores
    from .shards import atomic_write_parquet, record_shard

    build = layout.build
    if layout.shard(s).exists():
        return True
    scores = read_scores(layout.scores(s)) if layout.scores(s).is_dir() else {}
    ids = list(build.shard_ids(s))
    if any(i not in scores for i in ids) or not layout.retrieved(s).exists():
        return False
    rows = pq.read_table(layout.retrieved(s)).to_pydict()
    if rows["id"] != ids:
        raise BuildError(f"{layout.retrieved(s)} does not hold examples {ids[0]}..{ids[-1]}; delete {layout.work}")
    wins = [window_ending_at(p, build.windows.stride, window) for p in rows["position"]]
    prefix_ids = [np.asarray(tokens[w.begin:w.target_begin], dtype=np.int32) for w in wins]
    target_ids = [np.asarray(tokens[w.target_begin:w.end], dtype=np.int32) for w in wins]
    lm, nodoc = [], []
    for i, n in zip(ids, rows["n_candidates"]):
        cand, none = scores[i]
        if len(cand) != n:
            raise BuildError(f"example {i}: {len(cand)} scores for {n} candidates; delete {layout.scores(s)}")
        lm.append(cand)
        nodoc.append(none)
    table = pa.table({
        "id": pa.array(ids, pa.int64()), "source_title": rows["source_title"], "position": rows["position"],
        "prefix_text": tokenizer.batch_decode([x.tolist() for x in prefix_ids]), "prefix_ids": prefix_ids,
        "target_ids": target_ids, "target_text": tokenizer.batch_decode([x.tolist() for x in target_ids]),
        "query": rows["query"], "doc_ids": rows["doc_ids"], "doc_titles": rows["doc_titles"],
        "doc_texts": rows["doc_texts"], "bm25_scores": rows["bm25_scores"], "lm_logprobs": lm,
        "nodoc_logprob": pa.array(nodoc, pa.float32()), "n_candidates": pa.array(rows["n_candidates"], pa.int32()),
        "note": rows["note"],
    }, schema=TRAINING_SCHEMA)
    atomic_write_parquet(layout.shard(s), table)
    record_shard(layout, layout.shard(s))
    shutil.rmtree(layout.scores(s), ignore_errors=True)
    return True


def stage_score(layout, run: RunConfig, window: int, rank0: bool, n_total: int, shard_done=None) -> bool:
    """Score the pending chunks with Lightning; returns True in the process that writes the dataset."""
    from torch.utils.data import DataLoader

    from ralm.cli import quiet_lightning
    from ralm.precision import for_run
    from ralm.progress import Progress
    from ralm.stage import open_lm, predict

    from .score import ChunkDataset, LMScoringModule, ScoreWriter, unwrap

    quiet_lightning(run.verbose)
    build = layout.build
    chunks = pending_chunks(layout, run.batch_examples)
    if not chunks:
        return rank0
    n_ex = sum(len(c[1]) for c in chunks)
    precision = for_run(run.scoring.dtype, run.trainer.accelerator)
    if rank0:
        _log(f"[score] {n_ex:,} example(s) in {len(chunks):,} step(s) of <= {run.batch_examples} examples "
             f"(<= {run.batch_examples * (build.retrieval.k + 1)} LM rows of {window} tokens each); LM compute "
             f"dtype {precision.describe(run.scoring.dtype)}")
    model = open_lm(build.model, run.scoring, layout.work)
    shards = sorted({s for s, _ in chunks})
    dataset = ChunkDataset(chunks, {s: str(layout.retrieved(s)) for s in shards}, str(layout.tokens), build.model,
                           window, build.windows.stride, build.windows.doc_max_tokens, str(layout.retrieve_failed))
    loader = DataLoader(dataset, batch_size=1, shuffle=False, collate_fn=unwrap, num_workers=run.num_workers,
                        multiprocessing_context="spawn" if run.num_workers > 0 else None,
                        persistent_workers=run.num_workers > 0)
    module = LMScoringModule(model, stride=build.windows.stride, batch_size=run.scoring.batch_size,
                             dtype=precision.dtype)
    bar = Progress(n_total, "score", "examples", enabled=run.progress and rank0, initial=n_total - n_ex)
    writer = ScoreWriter(layout.scores_dir, bar, shard_done)
    is_zero, dt, world = predict(module, loader, writer, run.trainer, run.scoring, "data_gen.score")
    bar.close()
    if is_zero:
        _log(f"[score] {n_ex:,} examples in {dt:.1f}s: {n_ex / dt:,.1f} examples/s, "
             f"{n_ex * (build.retrieval.k + 1) * window / dt:,.0f} LM tokens/s (world size {world})")
    return is_zero


# ---------------------------------------------------------------------------------------------
# the job


def build_dataset(build: BuildConfig, run: RunConfig) -> dict | None:
    """Run (or resume) the whole job; returns the manifest when the dataset is complete."""
    from ralm.cli import quiet_libraries
    from ralm.outputs import global_rank

    from .shards import Layout, check_config

    quiet_libraries(run.verbose)
    layout = Layout(run.out, build)
    rank0 = global_rank() == 0
    check_config(layout)
    if layout.manifest.exists():
        return _already_complete(layout, rank0)
    tokenizer, window, forbidden = _check_inputs(layout, build)
    if rank0:
        _clean_after_kill(layout)
    tokens, samples = stage_sample(layout, build, tokenizer, window, write=rank0)
    if run.stage == "sample":
        return None
    thread = _retrieve(layout, run, tokens, samples, forbidden, rank0)
    if run.stage == "retrieve":
        return None
    if rank0:  # shards completed by a killed run (all chunks scored, shard not yet written)
        for s in range(build.n_shards):
            if not layout.shard(s).exists() and layout.scores(s).is_dir():
                assemble_shard(layout, s, tokens, tokenizer, window)

    def shard_done(s: int) -> None:  # a finished shard becomes final while later ones are scored
        if assemble_shard(layout, s, tokens, tokenizer, window):
            _log(f"[score] shard {s} written: {layout.shard(s).name}")

    writer = stage_score(layout, run, window, rank0, build.examples, shard_done)
    if thread is not None:
        thread.join()
        if thread.error is not None:
            raise thread.error
    if not writer:
        return None
    for s in range(build.n_shards):
        if not assemble_shard(layout, s, tokens, tokenizer, window):
            raise BuildError(f"shard {s} has unscored examples after scoring; rerun the same command")
    return write_manifest(layout, run, window, tokenizer, len(tokens))


def _already_complete(layout, rank0: bool) -> dict:
    """A finished job: check every shard against its manifest and return the manifest."""
    from .shards import verify_manifest

    manifest = json.loads(layout.manifest.read_text())
    verify_manifest(layout, manifest)
    if rank0:
        _log(f"already complete: {manifest['examples']:,} examples in {len(manifest['shards'])} shard(s) under "
             f"{layout.data}, every shard matching the manifest (content hash {manifest['content_hash'][:16]}...)")
    return manifest


def _check_inputs(layout, build: BuildConfig):
    """Before anything is written: the output is writable, the LM and the index are usable. Returns the
    tokenizer, the window L and the forbidden evaluation titles."""
    from ralm.files import check_writable
    from ralm.retrieval import check_index

    check_writable(layout.root, "--out")
    tokenizer, window = check_model(build)
    check_index(build.retrieval.index)
    return tokenizer, window, forbidden_from_eval(build)


def _clean_after_kill(layout) -> None:
    """Rank 0: drop a killed run's old temporaries (not a live writer's on another node) and the shards
    whose bytes no longer match the hash recorded when they were written."""
    from .shards import drop_bad_shards

    for f in layout.root.rglob(".*.tmp"):
        if time.time() - f.stat().st_mtime > 600:
            f.unlink(missing_ok=True)
    bad = drop_bad_shards(layout)
    if bad:
        _log(f"{len(bad)} shard(s) no longer match the hash recorded when written ({bad[:3]}); scoring them again")


def _retrieve(layout, run: RunConfig, tokens, samples, forbidden, rank0: bool):
    """BM25 for the shards that lack it, on rank 0: now (``--stage retrieve``), or in a background
    thread that scoring waits on shard by shard (returned; None when there is nothing to retrieve)."""
    from .retrieve import RetrieveThread, run_retrieve, shards_to_retrieve

    todo = shards_to_retrieve(layout)  # rank 0 retrieves them; other ranks wait for each shard they score
    if not todo:
        return None
    args = (layout, layout.build.model, tokens, samples, forbidden, run.retrieval_batch, run.verbose, _log)
    if run.stage == "retrieve":
        if rank0:
            _log(f"[retrieve] {len(todo)} shard(s), {len(forbidden):,} forbidden evaluation title(s)")
            run_retrieve(*args)
        return None
    layout.retrieve_failed.unlink(missing_ok=True)
    if not rank0:
        return None
    _log(f"[retrieve] {len(todo)} shard(s) in the background, {len(forbidden):,} forbidden evaluation "
         "title(s); scoring starts with the first one")
    thread = RetrieveThread(*args)
    thread.start()
    return thread


def write_manifest(layout, run: RunConfig, window: int, tokenizer, n_tokens: int) -> dict:
    import pyarrow.parquet as pq

    from ralm.precision import for_run
    from ralm.schema import TRAINING_SCHEMA

    from .shards import atomic_write_json, content_hash, file_sha256, package_versions

    build = layout.build
    shards, short = [], 0
    for p in layout.shard_paths():
        meta = pq.read_metadata(p)
        short += sum(1 for n in pq.read_table(p, columns=["n_candidates"]).column(0).to_pylist() if n < build.retrieval.k)
        shards.append({"file": p.name, "rows": meta.num_rows, "sha256": file_sha256(p)})
    retrieval = json.loads(layout.retrieval_info.read_text()) if layout.retrieval_info.exists() else {}
    manifest = {
        "examples": build.examples, "content_hash": content_hash(shards), "shards": shards,
        "data_files": "*.parquet",  # relative to this manifest
        "lm": build.model, "tokenizer_class": type(tokenizer).__name__, "vocab_size": len(tokenizer),
        "training_text": build.text.describe(), "training_text_tokens": int(n_tokens),
        "forbidden_titles_from": build.eval_text.describe() if build.eval_text.given else None,
        "index_fingerprint": retrieval.get("fingerprint"), "corpus_passages": retrieval.get("num_docs"),
        "n_forbidden_titles": retrieval.get("n_forbidden_titles"), "L": window,
        "examples_with_fewer_than_k": short,
        # how the last scoring run computed (auto resolves by the hardware: ralm.precision)
        "scoring_dtype": for_run(run.scoring.dtype, run.trainer.accelerator).dtype,
        "lm_logprobs": "sum over the s target tokens of log p (nats, float32), per candidate, BM25 rank order",
        "schema": {f.name: str(f.type) for f in TRAINING_SCHEMA},
        "config": build.to_dict(), "versions": package_versions(),
    }
    atomic_write_json(layout.manifest, manifest)
    if not run.keep_work:
        shutil.rmtree(layout.work, ignore_errors=True)
    _log(f"done: {build.examples:,} examples in {len(shards)} shard(s) under {layout.data}; "
         f"content hash {manifest['content_hash']}")
    return manifest


# ---------------------------------------------------------------------------------------------
# CLI


def build(examples: int = 300_000, seed: int = 0, shard_size: int = 1000, model: str = "gpt2",
          text: Text = WIKITEXT103_TRAIN, eval_text: Text = WIKITEXT103_TEST, retrieval: Retrieval = Retrieval(),
          windows: Windows = Windows(), out: str = "checkpoints/data_gen", stage: str = "all", batch_examples: int = 8,
          scoring: Scoring = Scoring(), num_workers: int = 0, retrieval_batch: int = 256, keep_work: bool = False,
          trainer: Devices = Devices(), verbose: bool = False, progress: bool = True,
          exclude_source: bool = True) -> dict | None:
    """Build (or resume, or check) an LM-supervised reranker training set.

    Args:
        examples: Training examples (sampled prefix positions). Part of the dataset's identity, as are
            seed, shard_size, model, text, eval_text, retrieval and windows (stored in OUT/config.json).
        seed: Seed of the position sampler.
        shard_size: Examples per output parquet shard (the unit of resume).
        model: The frozen causal LM that scores (its tokenizer is used too): a short name, a directory, a
            .gguf file or a hub id.
        text: The training text (prefixes are sampled from it).
        eval_text: The evaluation text whose article titles are never retrieved (--eval_text.dataset null: none).
        retrieval: BM25 candidates: index, k, query tokens, k1, b (forbid_eval_titles: use eval_text's titles).
        windows: s (target tokens per example), L and the document budget.
        out: Output directory (shards, manifest.json, config.json, work/).
        stage: Stop after this stage: sample | retrieve | all (score and write the dataset). Several nodes:
            run --stage retrieve once first, then the same command with --stage all on every node.
        batch_examples: Examples per scoring step (each gives k+1 LM rows).
        scoring: LM rows per forward, compute dtype, and the placement of an LM larger than one device.
        num_workers: DataLoader workers building scoring batches (spawned).
        retrieval_batch: Queries per BM25 batch.
        keep_work: Keep OUT/work (token cache, retrieval results) after the dataset is complete.
        trainer: Lightning devices for the scoring stage.
        verbose: Show library and Java logging.
        progress: Show progress (a bar on a terminal, periodic lines otherwise).
        exclude_source: Never retrieve a passage titled like the example's own article (false: for a corpus
            that holds only parts of the articles the prefixes do not come from, e.g. their first halves).
    """
    b = BuildConfig(examples=examples, seed=seed, shard_size=shard_size, model=model, text=text, eval_text=eval_text,
                    retrieval=retrieval, windows=windows, exclude_source=exclude_source)
    r = RunConfig(out=out, stage=stage, batch_examples=batch_examples, scoring=scoring, num_workers=num_workers,
                  retrieval_batch=retrieval_batch, keep_work=keep_work, trainer=trainer, verbose=verbose,
                  progress=progress)
    trainer.kwargs(one_process=scoring.device_map is not None)  # a bad device combination fails before any work
    from ralm.outputs import claim

    with claim(r.out, "--out"):  # a second build on the same --out is refused, not mixed in
        return build_dataset(b, r)


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(build, argv, "python -m data_gen.build", description=__doc__, after=lambda m, kw: 0)


if __name__ == "__main__":
    sys.exit(main())
