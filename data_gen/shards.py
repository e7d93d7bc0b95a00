"""Files of a build: layout, atomic writes, the stored config, shard hashes, the manifest.

Layout of ``OUT``::

    config.json                       identity of the dataset (BuildConfig), written once the inputs passed
    train-00000-of-00300.parquet      the dataset (final shards; schema ralm.schema.TRAINING_SCHEMA)
    manifest.json                     written last: the job is complete when it exists
    work/                             resumable intermediates (deleted at the end unless --keep_work)
        tokens.npy, samples.parquet, retrieval.json
        retrieved/shard-00000.parquet stage "retrieve"
        scores/shard-00000/*.npz      stage "score": one file per scoring step, keyed by example ids
        shard_hashes.json             sha256 of every final shard written so far (checked on resume)

Every file is written to a temporary name in its final folder and moved in place with
``os.replace`` (atomic on POSIX), so a SIGKILL never leaves a partial file under a final name; a
full disk is reported as one line, never as a truncated shard.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ralm.files import atomic_write, file_sha256
from ralm.lock import LOCK
from ralm.precision import for_run
from ralm.schema import TRAINING_SCHEMA
from ralm.scoring import DocumentEncoder

from .config import BuildConfig, BuildError, RunConfig, config_diff, identity_json, log, shard_file

#: Stage "retrieve" output per shard (input of stage "score"): the training schema's retrieval columns.
RETRIEVED_SCHEMA = pa.schema([TRAINING_SCHEMA.field(name) for name in (
    "id", "source_title", "position", "query", "doc_ids", "doc_titles", "doc_texts", "bm25_scores", "n_candidates",
    "note")])


_atomic = atomic_write


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic(path, lambda t: Path(t).write_bytes(data))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode())


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    _atomic(path, lambda t: pq.write_table(table, t, compression="zstd"))


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    def write(t):
        with open(t, "wb") as f:
            np.save(f, array)

    _atomic(path, write)


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    def write(t):
        with open(t, "wb") as f:
            np.savez(f, **arrays)

    _atomic(path, write)


class Layout:
    """Paths of one output directory."""

    def __init__(self, out: str | Path, build: BuildConfig):
        self.root = Path(out)
        self.build = build
        self.config = self.root / "config.json"
        self.text_record = self.root / "text.json"  # the training text's sha256: its path is the identity's
        self.manifest = self.root / "manifest.json"
        self.data = self.root  # shards at the top: reranking.fit --data.data_dir OUT
        self.work = self.root / "work"
        self.tokens = self.work / "tokens.npy"
        self.samples = self.work / "samples.parquet"
        self.retrieval_info = self.work / "retrieval.json"
        self.retrieved_dir = self.work / "retrieved"
        self.scores_dir = self.work / "scores"
        self.hashes = self.work / "shard_hashes.json"
        self.retrieve_failed = self.work / "retrieve.failed"

    def shard(self, i: int) -> Path:
        return self.data / shard_file(i, self.build.n_shards)

    def retrieved(self, i: int) -> Path:
        return self.retrieved_dir / f"shard-{i:05d}.parquet"

    def scores(self, i: int) -> Path:
        return self.scores_dir / f"shard-{i:05d}"

    def shard_paths(self) -> list[Path]:
        return [self.shard(i) for i in range(self.build.n_shards)]

    def existing_shards(self) -> list[tuple[int, Path]]:
        """(index, path) of the final shards on disk, found by listing the directory: checking every
        possible index costs a stat per shard, minutes for a mistyped ``--examples`` (millions of shards)."""
        n = self.build.n_shards
        found = []
        for p in self.data.glob(f"train-*-of-{n:05d}.parquet") if self.data.is_dir() else ():
            i = p.name[len("train-"):-len(f"-of-{n:05d}.parquet")]
            if i.isdigit() and int(i) < n and p == self.shard(int(i)):
                found.append((int(i), p))
        return sorted(found)


def check_config(layout: Layout) -> bool:
    """Refuse a directory that holds another dataset (or is not a data_gen output). True if config.json exists."""
    if layout.config.exists():
        try:
            stored = json.loads(layout.config.read_text())
        except ValueError:
            raise BuildError(f"{layout.config} is not valid JSON; delete {layout.root} to start over") from None
        diff = config_diff(stored, layout.build)
        smaller = stored.get("examples", 0) > layout.build.examples
        if smaller and [d.split(":")[0] for d in diff] == ["examples"]:  # keep what was scored: read a prefix
            n, have = layout.build.examples, stored["examples"]
            raise BuildError(f"{layout.root} holds a set of {have:,} examples built with these settings; a set of "
                             f"{n:,} is its first {n:,} (the sampler draws positions in example order, so any prefix "
                             f"is a uniform sample): train on them with `python -m reranking.fit --data.examples {n}` "
                             f"(a pipeline fit: set: {{data.examples: {n}}}), nothing rescored and nothing removed; "
                             f"or give another --out to sample {n:,} anew")
        if diff:
            raise BuildError(f"{layout.root} already holds a dataset built with a different configuration "
                             f"({layout.config}): " + "; ".join(diff) + f". Use another --out, rerun with the stored "
                             f"settings, or delete {layout.root} to start over")
        check_text(layout)
        return True
    if layout.root.exists() and any(p.name not in ("work", LOCK) for p in layout.root.iterdir()):
        raise BuildError(f"--out {layout.root} is not empty and has no config.json: it is not a data_gen output. "
                         "Pick an empty or new directory")
    return False


def store_config(layout: Layout) -> None:
    """Record the dataset's identity; called only once the inputs have been checked."""
    if not layout.config.exists():
        atomic_write_bytes(layout.config, (identity_json(layout.build) + "\n").encode())
    check_text(layout)


def _text_sha256(layout: Layout) -> str | None:
    f = layout.build.text.file
    return file_sha256(f) if f and Path(f).is_file() else None


def check_text(layout: Layout) -> None:
    """The training text a dataset was sampled from, by content: a text edited in place (the same path) is
    refused by name rather than its old samples reused; the first run records it (builds made before this
    record nothing, and are taken as they are)."""
    now = _text_sha256(layout)
    if now is None:
        return
    if layout.text_record.exists():
        before = json.loads(layout.text_record.read_text()).get("sha256")
        if before and before != now:
            raise BuildError(f"--text.file {layout.build.text.file} changed since {layout.root} was sampled from it "
                             f"(sha256 {before[:12]}… then, {now[:12]}… now): its examples are of the old text. Use "
                             f"another --out, restore the text, or delete {layout.root} to start over")
    else:
        atomic_write_json(layout.text_record, {"file": Path(layout.build.text.file).name, "sha256": now})



def record_shard(layout: Layout, path: Path) -> None:
    """Remember a final shard's sha256 (checked when a killed run resumes)."""
    rec = json.loads(layout.hashes.read_text()) if layout.hashes.exists() else {}
    rec[path.name] = file_sha256(path)
    atomic_write_json(layout.hashes, rec)


def drop_bad_shards(layout: Layout) -> list[str]:
    """Delete final shards whose sha256 differs from the one recorded when they were written (a shard
    truncated or changed since); their examples are scored again. A shard with no record (work/ was
    deleted, or the shards were committed and cloned without it) is kept when it reads as a parquet
    file holding exactly its examples' ids, and its hash is recorded then. Returns the names dropped."""
    rec = json.loads(layout.hashes.read_text()) if layout.hashes.exists() else {}
    bad, adopted = [], False
    for s, p in layout.existing_shards():
        if p.name in rec:
            ok = rec[p.name] == file_sha256(p)
        else:
            ok = _holds_ids(p, layout.build.shard_ids(s))
            if ok:
                rec[p.name], adopted = file_sha256(p), True
        if not ok:
            p.unlink()
            bad.append(p.name)
    if adopted:
        atomic_write_json(layout.hashes, rec)
    return bad


def _holds_ids(path: Path, ids: range) -> bool:
    try:
        got = pq.read_table(path, columns=["id"]).column("id").to_pylist()
    except Exception:  # unreadable (truncated, not parquet): scored again
        return False
    return got == list(ids)


#: Parquet schema metadata of a shard: the compute dtypes its log-probabilities were scored in.
SHARD_DTYPE_KEY = b"scoring_dtype"


def shard_dtype(meta: pq.FileMetaData) -> str | None:
    """A shard's scoring dtypes (``"float32"``, ``"bfloat16"``, or both comma-separated); ``None`` for a
    shard written before they were recorded."""
    got = (meta.metadata or {}).get(SHARD_DTYPE_KEY)
    return got.decode() if got is not None else None


def verify_manifest(layout: Layout, manifest: dict) -> None:
    """A finished dataset's shards must be exactly the ones the manifest lists (sha256 each)."""
    bad = []
    for s in manifest["shards"]:
        p = layout.data / s["file"]
        if not p.exists():
            bad.append(f"{s['file']} is missing")
        elif file_sha256(p) != s["sha256"]:
            bad.append(f"{s['file']} differs from the manifest (truncated or modified)")
    if bad:
        raise BuildError(f"{layout.root} is a finished dataset but {'; '.join(bad[:3])}"
                         f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}. Delete those shards and "
                         f"{layout.manifest.name}, then rerun the same command to rebuild them")


def content_hash(shards: list[dict]) -> str:
    """sha256 over the ordered (shard name, shard sha256) list."""
    h = hashlib.sha256()
    for s in shards:
        h.update(f"{s['file']}:{s['sha256']}\n".encode())
    return h.hexdigest()


def package_versions() -> dict:
    out = {}
    for name in ("torch", "transformers", "tokenizers", "lightning", "datasets", "pyarrow", "numpy", "pyserini"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


# ---------------------------------------------------------------- score files and the retrieval hand-off

def done_ids(scores_dir: Path) -> set[int]:
    """Example ids already scored (present in a finished chunk file of ``scores_dir``)."""
    out: set[int] = set()
    if scores_dir.is_dir():
        for f in sorted(scores_dir.glob("ids-*.npz")):
            with np.load(f) as z:
                out.update(int(i) for i in z["ids"])
    return out


def read_scores(scores_dir: Path) -> tuple[dict[int, tuple[np.ndarray, float]], list[str]]:
    """id -> (candidate log-probs (n_candidates,), no-document log-prob) from all chunk files, and the
    compute dtypes those chunks were scored in (``unrecorded``: a chunk written before the dtype was stored)."""
    out: dict[int, tuple[np.ndarray, float]] = {}
    dtypes: set[str] = set()
    for f in sorted(scores_dir.glob("ids-*.npz")):
        with np.load(f) as z:
            ids, counts, logp = z["ids"], z["counts"], z["logprobs"]
            dtypes.add(str(z["dtype"]) if "dtype" in z.files else "unrecorded")
        offset = 0
        for i, c in zip(ids.tolist(), counts.tolist()):
            out[int(i)] = (logp[offset:offset + c].astype(np.float32), float(logp[offset + c]))
            offset += c + 1
    return out, sorted(dtypes)


def write_chunk(shard_dir: Path, ids: np.ndarray, counts: np.ndarray, logprobs: np.ndarray, dtype: str) -> None:
    """One chunk file as :func:`read_scores` reads it: ``shard_dir/ids-FIRSTID.npz`` holding each example's
    candidate log-probs in rank order, then its no-document log-prob, with the compute dtype."""
    atomic_save_npz(Path(shard_dir) / f"ids-{int(ids[0]):09d}.npz", ids=np.asarray(ids, np.int64),
                    counts=np.asarray(counts, np.int64), logprobs=np.asarray(logprobs, np.float32), dtype=np.array(dtype))


def wait_for_shard(path: Path, failed: Path, poll: float = 0.2) -> None:
    """Block until stage "retrieve" has written ``path`` (raise its error if it failed)."""
    while not path.exists():
        if failed.exists():
            raise BuildError(f"retrieval failed: {failed.read_text()}")
        time.sleep(poll)


def assemble_shard(layout: Layout, s: int, tokens, tokenizer, window: int) -> bool:
    """Write final shard ``s`` from its retrieval and score files if all its examples are scored."""
    build = layout.build
    if layout.shard(s).exists():
        return True
    scores, dtypes = read_scores(layout.scores(s)) if layout.scores(s).is_dir() else ({}, [])
    ids = list(build.shard_ids(s))
    if any(i not in scores for i in ids) or not layout.retrieved(s).exists():
        return False
    rows = pq.read_table(layout.retrieved(s)).to_pydict()
    if rows["id"] != ids:
        raise BuildError(f"{layout.retrieved(s)} does not hold examples {ids[0]}..{ids[-1]}; delete {layout.work}")
    stride = build.windows.stride
    # an example's prefix: its window's tokens before its target (with m targets a window ends after the last)
    ends = [build.targets.window_end(i, p, stride) for i, p in zip(ids, rows["position"])]
    prefix_ids = [np.asarray(tokens[e - window:p], dtype=np.int32) for e, p in zip(ends, rows["position"])]
    target_ids = [np.asarray(tokens[p:p + stride], dtype=np.int32) for p in rows["position"]]
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
    # more than one dtype: a resumed job changed machines
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), SHARD_DTYPE_KEY: ",".join(dtypes).encode()})
    atomic_write_parquet(layout.shard(s), table)
    record_shard(layout, layout.shard(s))
    shutil.rmtree(layout.scores(s), ignore_errors=True)
    return True


def write_manifest(layout: Layout, run: RunConfig, window: int, tokenizer, n_tokens: int) -> dict:
    """The last file of a build: shards with their hashes, provenance and versions; then work/ goes."""
    build = layout.build
    shards, short = [], 0
    for p in layout.shard_paths():
        meta = pq.read_metadata(p)
        short += sum(1 for n in pq.read_table(p, columns=["n_candidates"]).column(0).to_pylist() if n < build.retrieval.k)
        shards.append({"file": p.name, "rows": meta.num_rows, "sha256": file_sha256(p),
                       "scoring_dtype": shard_dtype(meta)})
    retrieval = json.loads(layout.retrieval_info.read_text()) if layout.retrieval_info.exists() else {}
    manifest = {
        "examples": build.examples, "content_hash": content_hash(shards), "shards": shards,
        "data_files": "*.parquet",  # relative to this manifest
        "lm": build.model, "tokenizer_class": type(tokenizer).__name__, "vocab_size": len(tokenizer),
        "training_text": build.text.describe(), "training_text_tokens": int(n_tokens),
        "forbidden_titles_from": build.eval_text.describe() if build.eval_text.given else None,
        "index_fingerprint": retrieval.get("fingerprint"), "corpus_passages": retrieval.get("num_docs"),
        "n_forbidden_titles": retrieval.get("n_forbidden_titles"), "L": window,
        "row_start": DocumentEncoder(tokenizer, bos=build.windows.bos).describe(),
        "examples_with_fewer_than_k": short,
        # how the last scoring run computed (auto resolves by the hardware: ralm.precision); each shard's
        # own dtypes are in its entry above
        "scoring_dtype": for_run(run.scoring.dtype, run.trainer.accelerator).dtype,
        "lm_logprobs": "sum over the s target tokens of log p (nats, float32), per candidate, BM25 rank order",
        "schema": {f.name: str(f.type) for f in TRAINING_SCHEMA},
        "config": build.to_dict(), "versions": package_versions(),
    }
    atomic_write_json(layout.manifest, manifest)
    if not run.keep_work:
        shutil.rmtree(layout.work, ignore_errors=True)
    log(f"done: {build.examples:,} examples in {len(shards)} shard(s) under {layout.data}; "
         f"content hash {manifest['content_hash']}")
    return manifest
