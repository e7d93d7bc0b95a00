"""Build the predictive reranker's training set: sample → retrieve (BM25) → score (frozen LM) → parquet.

    python -m data_gen.build --examples 300000                       # paper settings (configs/build.yaml)
    python -m data_gen.build --config configs/build.yaml --devices 4 --strategy ddp
    python -m data_gen.build --text-file train.txt --index corpus/index --model ./tiny --max-length 128 \\
        --doc-max-tokens 64 --examples 1000 --eval-dataset none --out out/data

Each example is a prefix x of the training text (the window's first L - s tokens), its next s tokens
y, the BM25 top-k passages d_1..d_k for the query made of x's last ℓ tokens (never from x's own
article nor from the forbidden evaluation articles), and log p(y | d_j ; x) for every j plus
log p(y | x). Every stage works in shards and resumes after a kill; re-running a finished job does
nothing. The result is ``OUT/*.parquet`` (load with
``datasets.load_dataset("parquet", data_files="OUT/*.parquet")``) plus ``OUT/manifest.json``.

Scoring runs through a Lightning ``Trainer.predict``: ``--devices 8 --strategy ddp`` (or
``--trainer.devices`` ...) spreads it over GPUs; several nodes: run ``--stage retrieve`` once first.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
import types
import typing

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .config import BuildConfig, BuildError, RunConfig, TrainerConfig, load_yaml, split_settings
from .shards import (SCHEMA, Layout, atomic_save_npy, atomic_write_json, atomic_write_parquet,
                     check_or_store_config, content_hash, file_sha256, package_versions)


def _log(msg: str) -> None:
    print(f"[data_gen] {msg}", flush=True)


def global_rank() -> int:
    """This process's global rank from the launcher's environment (0 when not distributed)."""
    for key in ("RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if os.environ.get(key):
            return int(os.environ[key])
    if int(os.environ.get("NODE_RANK", "0") or 0) > 0:
        return 1  # some rank on another node: not the one that writes
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


# ---------------------------------------------------------------------------------------------
# inputs


def load_tokenizer(name: str):
    from transformers import AutoConfig, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name)
        cfg = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise BuildError(f"--model {name!r}: cannot load its tokenizer/config ({e}). Pass a Hugging Face hub "
                         "name (needs the network or a warm cache) or a local save_pretrained directory.") from e
    return tok, cfg


def effective_window(build: BuildConfig, model_config) -> int:
    from ralm.scoring import context_length

    try:
        ctx = context_length(types.SimpleNamespace(config=model_config))
    except ValueError as e:
        raise BuildError(f"--model {build.model!r}: {e}") from e
    window = min(build.max_length, ctx)
    if build.doc_max_tokens >= window - build.stride:
        raise BuildError(f"--doc-max-tokens {build.doc_max_tokens} must be < L - s = {window} - {build.stride} "
                         f"(L = min(--max-length, model context {ctx})); lower --doc-max-tokens")
    return window


def precheck_index(index: str) -> None:
    """Fail fast (before tokenizing the training text) on an index path that is not a Lucene index."""
    from pathlib import Path

    p = Path(index).expanduser()
    looks_like_path = p.exists() or "/" in index or index.startswith(".")
    if looks_like_path and not (p.is_dir() and any(p.glob("segments_*"))):
        raise BuildError(f"--index {index!r} is not a Lucene index directory (no segments_* file). Build one with "
                         "`python -m ralm.corpus --text-file TEXT --out DIR` and pass DIR/index, or pass a Pyserini "
                         "prebuilt index name such as 'wikipedia-dpr-100w'.")


def _load_text(dataset, name, split, text_file, what: str) -> str:
    from ralm.text import load_text

    try:
        return load_text(dataset=dataset, name=name, split=split, text_file=text_file)
    except (FileNotFoundError, ValueError) as e:
        raise BuildError(f"{what}: {e}") from e


def forbidden_from_eval(build: BuildConfig) -> set[str]:
    from ralm.corpus import forbidden_titles

    if build.eval_text_file:
        text = _load_text(None, None, build.eval_split, build.eval_text_file, "--eval-text-file")
    elif build.eval_dataset and build.eval_dataset.lower() not in ("none", "null"):
        text = _load_text(build.eval_dataset, build.eval_name, build.eval_split, None, "--eval-dataset")
    else:
        return set()
    titles = forbidden_titles(text)
    if not titles:
        raise BuildError("the evaluation text has no ` = Title = ` headings, so no title can be forbidden; "
                         "pass a WikiText-layout --eval-text-file or --eval-dataset none")
    return titles


# ---------------------------------------------------------------------------------------------
# stages


def stage_sample(layout: Layout, build: BuildConfig, tokenizer, window: int, write: bool) -> tuple[np.ndarray, pa.Table]:
    from .sample import sample_positions, tokenize_text

    if layout.tokens.exists() and layout.samples.exists():
        _log("[sample] reusing work/tokens.npy and work/samples.parquet")
        return np.load(layout.tokens, mmap_mode="r"), pq.read_table(layout.samples)
    if not write:
        raise BuildError(f"{layout.samples} is missing on a non-zero rank: run `--stage retrieve` once "
                         "(single process) before a multi-node scoring run")
    source = build.text_file or f"{build.dataset}/{build.dataset_name}/{build.split}"
    text = _load_text(build.dataset, build.dataset_name, build.split, build.text_file, "training text")
    t0 = time.perf_counter()
    tok = tokenize_text(tokenizer, text)
    _log(f"[sample] {source}: {len(text):,} chars → {len(tok.ids):,} tokens, {len(tok.titles):,} articles "
         f"in {time.perf_counter() - t0:.1f}s")
    positions = sample_positions(len(tok.ids), build.examples, window, build.stride, build.seed)
    samples = pa.table({"id": np.arange(build.examples, dtype=np.int64), "position": positions,
                        "source_title": tok.title_at(positions)})
    atomic_save_npy(layout.tokens, tok.ids)
    atomic_write_parquet(layout.samples, samples)
    return np.load(layout.tokens, mmap_mode="r"), samples


def pending_chunks(layout: Layout, build: BuildConfig, batch_examples: int) -> list[tuple[int, list[int]]]:
    """(shard, example ids) scoring steps still to do: unfinished shards minus ids found in chunk files."""
    from .score import done_ids

    chunks = []
    for s in range(build.n_shards):
        if layout.shard(s).exists():
            continue
        done = done_ids(layout.scores(s))
        todo = [i for i in build.shard_ids(s) if i not in done]
        chunks += [(s, todo[j:j + batch_examples]) for j in range(0, len(todo), batch_examples)]
    return chunks


def assemble_shard(layout: Layout, build: BuildConfig, s: int, tokens: np.ndarray, tokenizer,
                   window: int) -> bool:
    """Write final shard ``s`` from its retrieval and score files if all its examples are scored."""
    from .score import read_scores

    if layout.shard(s).exists():
        return True
    scores = read_scores(layout.scores(s)) if layout.scores(s).is_dir() else {}
    ids = list(build.shard_ids(s))
    if any(i not in scores for i in ids):
        return False
    rows = pq.read_table(layout.retrieved(s)).to_pydict()
    if rows["id"] != ids:
        raise BuildError(f"{layout.retrieved(s)} does not hold examples {ids[0]}..{ids[-1]}; delete {layout.work}")
    ctx = window - build.stride
    prefix_ids, target_ids = [], []
    for p in rows["position"]:
        prefix_ids.append(np.asarray(tokens[p - ctx:p], dtype=np.int32))
        target_ids.append(np.asarray(tokens[p:p + build.stride], dtype=np.int32))
    lm, nodoc = [], []
    for i, n in zip(ids, rows["n_candidates"]):
        cand, none = scores[i]
        if len(cand) != n:
            raise BuildError(f"example {i}: {len(cand)} scores for {n} candidates; delete {layout.scores(s)}")
        lm.append(cand)
        nodoc.append(none)
    table = pa.table({
        "id": pa.array(ids, pa.int64()),
        "source_title": rows["source_title"],
        "position": rows["position"],
        "prefix_text": tokenizer.batch_decode([x.tolist() for x in prefix_ids]),
        "prefix_ids": prefix_ids,
        "target_ids": target_ids,
        "target_text": tokenizer.batch_decode([x.tolist() for x in target_ids]),
        "query": rows["query"],
        "doc_ids": rows["doc_ids"],
        "doc_titles": rows["doc_titles"],
        "doc_texts": rows["doc_texts"],
        "bm25_scores": rows["bm25_scores"],
        "lm_logprobs": lm,
        "nodoc_logprob": pa.array(nodoc, pa.float32()),
        "n_candidates": pa.array(rows["n_candidates"], pa.int32()),
        "note": rows["note"],
    }, schema=SCHEMA)
    atomic_write_parquet(layout.shard(s), table)
    shutil.rmtree(layout.scores(s), ignore_errors=True)
    return True


def stage_score(layout: Layout, build: BuildConfig, run: RunConfig, window: int, rank0: bool) -> bool:
    """Score the pending chunks with Lightning; returns True in the process that writes the dataset."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from ralm.scoring import load_causal_lm

    from .score import ChunkDataset, LMScoringModule, ScoreWriter, unwrap

    chunks = pending_chunks(layout, build, run.batch_examples)
    if not chunks:
        _log("[score] nothing left to score")
        return rank0
    n_ex = sum(len(c[1]) for c in chunks)
    if rank0:
        _log(f"[score] {n_ex:,} example(s) in {len(chunks):,} step(s) of ≤{run.batch_examples} examples "
             f"(≤{run.batch_examples * (build.k + 1)} LM rows of {window} tokens each)")
    try:
        model, _ = load_causal_lm(build.model, device="cpu")
    except ValueError as e:
        raise BuildError(f"--model: {e}") from e
    shards = sorted({s for s, _ in chunks})
    dataset = ChunkDataset(chunks, {s: str(layout.retrieved(s)) for s in shards}, str(layout.tokens), build.model,
                           window, build.stride, build.doc_max_tokens)
    loader = DataLoader(dataset, batch_size=1, shuffle=False, collate_fn=unwrap, num_workers=run.num_workers,
                        multiprocessing_context="spawn" if run.num_workers > 0 else None,
                        persistent_workers=run.num_workers > 0)
    module = LMScoringModule(model, stride=build.stride, batch_size=run.batch_size, dtype=run.dtype)
    trainer = pl.Trainer(**run.trainer.kwargs(), logger=False, enable_checkpointing=False,
                         enable_model_summary=False, callbacks=[ScoreWriter(layout.scores_dir)],
                         inference_mode=True)
    t0 = time.perf_counter()
    trainer.predict(module, dataloaders=loader, return_predictions=False)
    trainer.strategy.barrier("data_gen.score.done")  # every rank's chunk files are on disk
    if trainer.is_global_zero:
        dt = time.perf_counter() - t0
        rows = n_ex * (build.k + 1)
        _log(f"[score] {n_ex:,} examples in {dt:.1f}s: {n_ex / dt:,.1f} examples/s, "
             f"{rows * window / dt:,.0f} LM tokens/s (world size {trainer.world_size})")
    return trainer.is_global_zero


# ---------------------------------------------------------------------------------------------
# the job


def build_dataset(build: BuildConfig, run: RunConfig) -> dict | None:
    """Run (or resume) the whole job; returns the manifest when the dataset is complete."""
    import json

    layout = Layout(run.out, build)
    rank0 = global_rank() == 0
    if layout.manifest.exists():
        check_or_store_config(layout, write=False)
        manifest = json.loads(layout.manifest.read_text())
        missing = [p.name for p in layout.shard_paths() if not p.exists()]
        if missing:
            raise BuildError(f"{layout.manifest} exists but shard(s) {missing[:3]} are missing; "
                             f"delete {layout.root} and rebuild")
        if rank0:
            _log(f"already complete: {manifest['examples']:,} examples in {len(manifest['shards'])} shard(s) "
                 f"under {layout.data} (content hash {manifest['content_hash'][:16]}…); nothing to do")
        return manifest
    if not rank0 and not layout.config.exists():
        raise BuildError(f"{layout.config} is missing on a non-zero rank; run `--stage retrieve` once first")
    check_or_store_config(layout, write=rank0)
    if rank0:  # temporaries of a killed run (old enough not to belong to a live writer on another node)
        for f in layout.root.rglob(".*.tmp"):
            if time.time() - f.stat().st_mtime > 600:
                f.unlink(missing_ok=True)
    tokenizer, model_config = load_tokenizer(build.model)
    window = effective_window(build, model_config)
    precheck_index(build.index)
    tokens, samples = stage_sample(layout, build, tokenizer, window, write=rank0)
    if run.stage == "sample":
        return None

    all_retrieved = all(layout.retrieved(s).exists() or layout.shard(s).exists() for s in range(build.n_shards))
    if not all_retrieved:
        if not rank0:
            raise BuildError("retrieval results are missing on a non-zero rank; run `--stage retrieve` once first")
        from .retrieve import run_retrieve

        forbidden = forbidden_from_eval(build)
        _log(f"[retrieve] {len(forbidden):,} forbidden evaluation title(s)")
        run_retrieve(layout, build, tokenizer, tokens, samples, forbidden, run.threads, run.retrieval_batch)
    elif rank0:
        _log(f"[retrieve] all {build.n_shards} shard(s) already retrieved")
    if run.stage == "retrieve":
        return None

    if rank0:  # shards completed by a killed run (all chunks scored, shard not yet written)
        for s in range(build.n_shards):
            if not layout.shard(s).exists() and layout.scores(s).is_dir():
                assemble_shard(layout, build, s, tokens, tokenizer, window)
    if not stage_score(layout, build, run, window, rank0):
        return None
    from tqdm.auto import tqdm

    for s in tqdm(range(build.n_shards), desc="write shards", unit="shard"):
        if not assemble_shard(layout, build, s, tokens, tokenizer, window):
            raise BuildError(f"shard {s} has unscored examples after scoring; re-run the same command")
    return write_manifest(layout, build, run, window, tokenizer, len(tokens))


def write_manifest(layout: Layout, build: BuildConfig, run: RunConfig, window: int, tokenizer, n_tokens: int) -> dict:
    import json

    shards, short = [], 0
    for p in layout.shard_paths():
        meta = pq.read_metadata(p)
        short += sum(1 for n in pq.read_table(p, columns=["n_candidates"]).column(0).to_pylist() if n < build.k)
        shards.append({"file": p.name, "rows": meta.num_rows, "sha256": file_sha256(p)})
    retrieval = json.loads(layout.retrieval_info.read_text()) if layout.retrieval_info.exists() else {}
    manifest = {
        "examples": build.examples,
        "content_hash": content_hash(shards),
        "shards": shards,
        "data_files": "*.parquet",  # relative to this manifest
        "lm": build.model,
        "tokenizer": build.model,
        "tokenizer_class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "training_text": build.text_file or f"{build.dataset}/{build.dataset_name}/{build.split}",
        "training_text_tokens": int(n_tokens),
        "forbidden_titles_from": build.eval_text_file or (
            f"{build.eval_dataset}/{build.eval_name}/{build.eval_split}" if build.eval_dataset else None),
        "index": build.index,
        "index_fingerprint": retrieval.get("fingerprint"),
        "corpus_passages": retrieval.get("num_docs"),
        "n_forbidden_titles": retrieval.get("n_forbidden_titles"),
        "k1": build.k1, "b": build.b, "k": build.k, "s": build.stride, "query_tokens": build.query_tokens,
        "L": window, "max_length": build.max_length, "doc_max_tokens": build.doc_max_tokens, "seed": build.seed,
        "shard_size": build.shard_size,
        "examples_with_fewer_than_k": short,
        "lm_logprobs": "sum over the s target tokens of log p (nats, float32), per candidate, BM25 rank order",
        "schema": {f.name: str(f.type) for f in SCHEMA},
        "config": build.to_dict(),
        "versions": package_versions(),
    }
    atomic_write_json(layout.manifest, manifest)
    if not run.keep_work:
        shutil.rmtree(layout.work, ignore_errors=True)
    _log(f"done: {build.examples:,} examples in {len(shards)} shard(s) under {layout.data}; "
         f"content hash {manifest['content_hash']}")
    return manifest


# ---------------------------------------------------------------------------------------------
# CLI


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _converter(tp):
    args = typing.get_args(tp)
    base = next((a for a in args if a is not type(None)), str) if args else tp
    if type(None) in args:
        return lambda v: None if str(v).lower() in ("none", "null", "") else base(v)
    return base


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_gen.build", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="YAML with any of the settings below (flags override it); see configs/build.yaml")
    hints = {**typing.get_type_hints(BuildConfig), **typing.get_type_hints(RunConfig)}
    for title, cls in (("dataset (stored in OUT/config.json; must match on resume)", BuildConfig),
                       ("run (may change between runs)", RunConfig)):
        g = p.add_argument_group(title)
        for f in dataclasses.fields(cls):
            if f.name == "trainer":
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            tp = hints[f.name]
            if tp is bool:
                g.add_argument(_flag(f.name), dest=f.name, action="store_true",
                               help=f"{f.metadata.get('help', '')}")
            else:
                g.add_argument(_flag(f.name), dest=f.name, type=_converter(tp), metavar=f.name.upper(),
                               help=f"{f.metadata.get('help', '')} (default: {default})")
    g = p.add_argument_group("Lightning Trainer (scoring stage)")
    for f in dataclasses.fields(TrainerConfig):
        g.add_argument(_flag(f.name), f"--trainer.{f.name}", dest=f"trainer.{f.name}", metavar=f.name.upper(),
                       help=f"{f.metadata.get('help', '')} (default: {f.default})")
    return p


def parse_settings(argv: list[str] | None = None) -> tuple[BuildConfig, RunConfig]:
    args = vars(make_parser().parse_args(argv))
    settings: dict = load_yaml(args.pop("config")) if "config" in args else {}
    settings = dict(settings)
    trainer = dict(settings.get("trainer") or {})
    for k, v in args.items():
        if k.startswith("trainer."):
            name = k.split(".", 1)[1]
            trainer[name] = int(v) if name == "num_nodes" else v
        else:
            settings[k] = v
    settings["trainer"] = trainer
    try:
        return split_settings(settings)
    except TypeError as e:
        raise BuildError(f"bad setting: {e}") from e


def main(argv: list[str] | None = None) -> int:
    try:
        build, run = parse_settings(argv)
        build_dataset(build, run)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
