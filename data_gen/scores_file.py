"""``python -m data_gen.scores_file``: a finished dataset's LM scores on their own, and back into a build.

Scoring is the one stage that needs the LM's compute (about 0.1-1 examples/s on 2 CPU cores, ~200/s on one
H100 or H200 for SmolLM2-135M); retrieval reruns anywhere in seconds to minutes and the texts come from
the training text. So a dataset scored on one machine can travel, or be committed, as its scores alone
(~40 bytes an example instead of ~3 kB with its passages), and be rebuilt elsewhere:

    python -m data_gen.scores_file export DATA scores.npz     # on the machine that scored DATA
    python -m data_gen.build ... --out NEW --stage retrieve    # elsewhere: DATA's settings, retrieval only
    python -m data_gen.scores_file import scores.npz NEW       # the scores where the score stage puts them
    python -m data_gen.build ... --out NEW                     # assembles the shards; nothing is scored

A long build on a CPU travels in parts: ``export`` of a build still running writes the shards finished so far
(``--shards 5:`` only those from shard 5 on), ``import`` takes several files, and the build scores only the
shards no file held, so a run stopped mid-way, or a later session on another machine, loses nothing committed.

The file records the dataset's identity (``config.json``) and content hash: ``import`` refuses a directory
built with other settings, and the final build prints its content hash (a hash of the shard files' bytes,
so equal to the source's where the pyarrow version is the same; the rows and values are equal regardless).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ralm.settings import InputError


def export(data: str, out: str, shards: str | None = None) -> str:
    """Write the LM scores of dataset ``data`` to ``out`` (.npz): of a finished one (its manifest exists) every
    shard; of one still being built, the shards finished so far (a part, committed while the rest is scored).
    ``shards``: ``FIRST:LAST`` (shard indices, LAST excluded) to write only those, e.g. the part not yet saved."""
    from data_gen.shards import shard_dtype  # the build's files (torch, via the precision record)
    from ralm.files import file_sha256

    d = Path(data)
    if not (d / "config.json").is_file():
        raise InputError(f"{d} has no config.json: not a data_gen.build output")
    config = json.loads((d / "config.json").read_text())
    n_shards = -(-config["examples"] // config["shard_size"])
    finished = (d / "manifest.json").is_file()
    manifest = json.loads((d / "manifest.json").read_text()) if finished else {}
    names = {int(p.name[len("train-"):-len(f"-of-{n_shards:05d}.parquet")]): p.name
             for p in d.glob(f"train-*-of-{n_shards:05d}.parquet")}
    lo, hi = _range(shards, n_shards)
    chosen = sorted(i for i in names if lo <= i < hi)
    if not chosen:
        raise InputError(f"{d} has no finished shard{f' in {shards}' if shards else ''} yet: nothing to export")
    arrays: dict[str, np.ndarray] = {
        "config": np.array((d / "config.json").read_text()),
        # the whole dataset's hash when every shard is in this file; else each shard's own (checked at assembly)
        "content_hash": np.array(manifest["content_hash"] if finished and len(chosen) == n_shards else "")}
    for i in chosen:
        t = pq.read_table(d / names[i], columns=["id", "lm_logprobs", "nodoc_logprob", "n_candidates"]).to_pydict()
        # the score stage's chunk layout: each example's candidates in rank order, then its no-document row
        rows = [np.append(np.asarray(c, np.float32), np.float32(n)) for c, n in zip(t["lm_logprobs"], t["nodoc_logprob"])]
        arrays[f"shard{i}_ids"] = np.asarray(t["id"], np.int64)
        arrays[f"shard{i}_counts"] = np.asarray(t["n_candidates"], np.int64)
        arrays[f"shard{i}_logprobs"] = np.concatenate(rows).astype(np.float32)
        arrays[f"shard{i}_dtype"] = np.array(shard_dtype(pq.read_metadata(d / names[i])) or "unrecorded")
        arrays[f"shard{i}_sha256"] = np.array(file_sha256(d / names[i]))
    np.savez_compressed(out, **arrays)
    n_ex = sum(len(arrays[f"shard{i}_ids"]) for i in chosen)
    whole = ("every shard" if len(chosen) == n_shards
             else f"shard{'s' if len(chosen) > 1 else ''} {_spans(chosen)} of {n_shards}")
    return f"{whole}, {n_ex:,} examples -> {out}"


def _range(shards: str | None, n: int) -> tuple[int, int]:
    if not shards:
        return 0, n
    try:
        lo, hi = (int(x) if x else d for x, d in zip(shards.split(":"), (0, n)))
    except ValueError:
        raise InputError(f"--shards {shards!r}: give FIRST:LAST, shard indices (LAST excluded), e.g. 0:5") from None
    return lo, hi


def _spans(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out, start = [], ids[0]
    for a, b in zip(ids, ids[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}-{a}" if a > start else f"{a}")
            start = b
    return ", ".join(out)


#: Settings that name where a file is, not what it holds: the same dataset may be built from copies elsewhere
#: (a rerun's own texts and index): each example's candidate count is checked at assembly, and the pipeline compares
#: the assembled dataset's content hash with the file's.
PATHS = ("text.file", "eval_text.file", "retrieval.index")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def settings_diff(here: dict, stored: dict) -> list[tuple[str, object, object]]:
    """``(setting, here, in the file)`` for every dataset setting that differs, paths left out (:data:`PATHS`;
    which file or index is read matters by its contents, which the assembly checks)."""
    a, b = _flat(here), _flat(stored)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if k not in PATHS and a.get(k) != b.get(k)]


def load_into(scores: str | list[str], out: str) -> str:
    """Place the scores of file(s) ``scores`` (a whole dataset, or parts of it) in ``out``'s work directory
    (``out``: the same dataset, retrieved). Shards no file holds are scored by the build, as in a resumed run."""
    from data_gen.shards import Layout, write_chunk  # the build's files (torch, via the precision record)

    o = Path(out)
    if not (o / "config.json").is_file():
        raise InputError(f"{o} has no config.json: run data_gen.build with the dataset's settings and "
                         f"--stage retrieve --out {o} first")
    here = json.loads((o / "config.json").read_text())
    layout = Layout(o, None)  # only its paths
    n, hashes = 0, []
    for f in [scores] if isinstance(scores, str) else scores:
        with np.load(f) as z:
            files = {k: z[k] for k in z.files}
        stored = json.loads(str(files["config"]))
        diff = [f"{k}: {a!r} there, {b!r} in the file" for k, a, b in settings_diff(here, stored)]
        if diff:
            raise InputError(f"{f} holds the scores of another dataset than {o}: " + "; ".join(diff))
        for k in sorted(files):
            if k.endswith("_ids"):
                s = int(k[len("shard"):-len("_ids")])
                write_chunk(layout.scores(s), files[k], files[f"shard{s}_counts"], files[f"shard{s}_logprobs"],
                            str(files[f"shard{s}_dtype"]))
                n += len(files[k])
        hashes.append(str(files["content_hash"]) or "none (a part: each shard's sha256 is in the file)")
    return (f"{n:,} examples' scores placed under {layout.scores_dir}; now rerun data_gen.build with the same "
            f"settings and --out {o} (it scores what no file held). The source's content hash: {'; '.join(hashes)} "
            "(a hash of the shard files' bytes: equal where the pyarrow version is the same)")


def shard_hashes(scores: str | list[str]) -> dict[int, str]:
    """Shard index -> the sha256 its source recorded (files written before per-shard hashes: none)."""
    out = {}
    for f in [scores] if isinstance(scores, str) else scores:
        with np.load(f) as z:
            out.update({int(k[len("shard"):-len("_sha256")]): str(z[k]) for k in z.files if k.endswith("_sha256")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_gen.scores_file", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="a finished dataset's scores to a .npz file")
    e.add_argument("data")
    e.add_argument("file")
    e.add_argument("--shards", help="FIRST:LAST: only these finished shards (LAST excluded), e.g. the part not yet "
                                    "saved; default: every finished one")
    i = sub.add_parser("import", help="scores files (a dataset's, or its parts) into a retrieved build directory "
                                      "of the same dataset")
    i.add_argument("file", nargs="+")
    i.add_argument("out")
    a = ap.parse_args(argv)
    try:
        print(export(a.data, a.file, a.shards) if a.cmd == "export" else load_into(a.file, a.out))
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
