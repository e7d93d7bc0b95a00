"""Files of a build: the output schema, atomic writes, the stored config, content hash, manifest.

Layout of ``OUT``::

    config.json                       identity of the dataset (BuildConfig), written on the first run
    train-00000-of-00300.parquet      the dataset (final shards; never rewritten)
    manifest.json                     written last: the job is complete when it exists
    work/                             resumable intermediates (deleted at the end unless --keep-work)
        tokens.npy, samples.parquet, retrieval.json
        retrieved/shard-00000.parquet stage "retrieve"
        scores/shard-00000/*.npz      stage "score": one file per scoring step, keyed by example ids

Every file is written to a temporary name in its final folder and moved in place with
``os.replace`` (atomic on POSIX), so a SIGKILL never leaves a partial file under a final name.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .config import BuildConfig, BuildError, identity

#: The contract with the reranker trainer: these names and types, in this order.
SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("source_title", pa.string()),
    ("position", pa.int64()),
    ("prefix_text", pa.string()),
    ("prefix_ids", pa.list_(pa.int32())),
    ("target_ids", pa.list_(pa.int32())),
    ("target_text", pa.string()),
    ("query", pa.string()),
    ("doc_ids", pa.list_(pa.string())),
    ("doc_titles", pa.list_(pa.string())),
    ("doc_texts", pa.list_(pa.string())),
    ("bm25_scores", pa.list_(pa.float32())),
    ("lm_logprobs", pa.list_(pa.float32())),
    ("nodoc_logprob", pa.float32()),
    ("n_candidates", pa.int32()),
    ("note", pa.string()),
])

#: Stage "retrieve" output per shard (input of stage "score").
RETRIEVED_SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("source_title", pa.string()),
    ("position", pa.int64()),
    ("query", pa.string()),
    ("doc_ids", pa.list_(pa.string())),
    ("doc_titles", pa.list_(pa.string())),
    ("doc_texts", pa.list_(pa.string())),
    ("bm25_scores", pa.list_(pa.float32())),
    ("n_candidates", pa.int32()),
    ("note", pa.string()),
])


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode())


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


class Layout:
    """Paths of one output directory."""

    def __init__(self, out: str | Path, build: BuildConfig):
        self.root = Path(out)
        self.build = build
        self.config = self.root / "config.json"
        self.manifest = self.root / "manifest.json"
        self.data = self.root  # shards at the top: data_files="OUT/*.parquet" (reranking.fit --data.data_dir OUT)
        self.work = self.root / "work"
        self.tokens = self.work / "tokens.npy"
        self.samples = self.work / "samples.parquet"
        self.retrieval_info = self.work / "retrieval.json"
        self.retrieved_dir = self.work / "retrieved"
        self.scores_dir = self.work / "scores"

    def shard(self, i: int) -> Path:
        return self.data / f"train-{i:05d}-of-{self.build.n_shards:05d}.parquet"

    def retrieved(self, i: int) -> Path:
        return self.retrieved_dir / f"shard-{i:05d}.parquet"

    def scores(self, i: int) -> Path:
        return self.scores_dir / f"shard-{i:05d}"

    def shard_paths(self) -> list[Path]:
        return [self.shard(i) for i in range(self.build.n_shards)]


def _same_setting(a, b) -> bool:
    """Equal, or two spellings (relative / absolute) of one existing file or directory."""
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str) and a and b and os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return False


def check_or_store_config(layout: Layout, write: bool = True) -> bool:
    """Compare the build config with ``OUT/config.json``; store it if absent. True if it was new.

    A different configuration is refused with the differing fields named.
    """
    mine = identity(layout.build)
    if layout.config.exists():
        old, new = json.loads(layout.config.read_text()), json.loads(mine)
        diff = [f"{k}: stored {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(set(old) | set(new))
                if not _same_setting(old.get(k), new.get(k))]
        if diff:
            raise BuildError(
                f"{layout.root} already holds a dataset built with a different configuration "
                f"({layout.config}):\n  " + "\n  ".join(diff) +
                "\nUse another --out, or re-run with the stored settings (e.g. --config "
                f"{layout.config} accepts this JSON's fields), or delete {layout.root} to start over.")
        return False
    if layout.root.exists() and any(layout.root.iterdir()):
        raise BuildError(f"--out {layout.root} is not empty and has no config.json: it is not a data_gen output. "
                         "Pick an empty or new directory.")
    if write:
        atomic_write_bytes(layout.config, (mine + "\n").encode())
    return True


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_hash(shards: list[dict]) -> str:
    """sha256 over the ordered (shard name, shard sha256) list."""
    h = hashlib.sha256()
    for s in shards:
        h.update(f"{s['file']}:{s['sha256']}\n".encode())
    return h.hexdigest()


def package_versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("torch", "transformers", "tokenizers", "lightning", "datasets", "pyarrow", "numpy", "pyserini"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out
