"""``python -m data_gen.scores_file``: a finished dataset's LM scores on their own, and back into a build.

Scoring is the one stage that needs the LM's compute (about 0.1-1 examples/s on 2 CPU cores, ~200/s on one
H100 or H200 for SmolLM2-135M); retrieval reruns anywhere in seconds to minutes and the texts come from
the training text. So a dataset scored on one machine can travel, or be committed, as its scores alone
(~40 bytes an example instead of ~3 kB with its passages), and be rebuilt elsewhere:

    python -m data_gen.scores_file export DATA scores.npz     # on the machine that scored DATA
    python -m data_gen.build ... --out NEW --stage retrieve    # elsewhere: DATA's settings, retrieval only
    python -m data_gen.scores_file import scores.npz NEW       # the scores where the score stage puts them
    python -m data_gen.build ... --out NEW                     # assembles the shards; nothing is scored

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


def export(data: str, out: str) -> str:
    """Write the LM scores of the finished dataset ``data`` (its manifest must exist) to ``out`` (.npz)."""
    d = Path(data)
    if not (d / "manifest.json").is_file():
        raise InputError(f"{d} has no manifest.json: not a finished data_gen.build output")
    manifest = json.loads((d / "manifest.json").read_text())
    arrays: dict[str, np.ndarray] = {
        "config": np.array((d / "config.json").read_text()), "content_hash": np.array(manifest["content_hash"])}
    for i, s in enumerate(manifest["shards"]):
        t = pq.read_table(d / s["file"], columns=["id", "lm_logprobs", "nodoc_logprob", "n_candidates"]).to_pydict()
        # the score stage's chunk layout: each example's candidates in rank order, then its no-document row
        rows = [np.append(np.asarray(c, np.float32), np.float32(n)) for c, n in zip(t["lm_logprobs"], t["nodoc_logprob"])]
        arrays[f"shard{i}_ids"] = np.asarray(t["id"], np.int64)
        arrays[f"shard{i}_counts"] = np.asarray(t["n_candidates"], np.int64)
        arrays[f"shard{i}_logprobs"] = np.concatenate(rows).astype(np.float32)
        arrays[f"shard{i}_dtype"] = np.array(s.get("scoring_dtype") or "unrecorded")
    np.savez_compressed(out, **arrays)
    return f"{len(manifest['shards'])} shard(s), {manifest['examples']:,} examples -> {out}"


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


def load_into(scores: str, out: str) -> str:
    """Place the scores of file ``scores`` in ``out``'s work directory (``out``: the same dataset, retrieved)."""
    from data_gen.shards import Layout, write_chunk  # the build's files (torch, via the precision record)

    with np.load(scores) as z:
        files = {k: z[k] for k in z.files}
    stored = json.loads(str(files["config"]))
    o = Path(out)
    if not (o / "config.json").is_file():
        raise InputError(f"{o} has no config.json: run data_gen.build with the dataset's settings and "
                         f"--stage retrieve --out {o} first (the settings: {json.dumps(stored)})")
    here = json.loads((o / "config.json").read_text())
    diff = [f"{k}: {a!r} there, {b!r} in the file" for k, a, b in settings_diff(here, stored)]
    if diff:
        raise InputError(f"{scores} holds the scores of another dataset than {o}: " + "; ".join(diff))
    layout = Layout(o, None)  # only its paths
    n = 0
    for k in sorted(files):
        if k.endswith("_ids"):
            s = int(k[len("shard"):-len("_ids")])
            write_chunk(layout.scores(s), files[k], files[f"shard{s}_counts"], files[f"shard{s}_logprobs"],
                        str(files[f"shard{s}_dtype"]))
            n += len(files[k])
    return (f"{n:,} examples' scores placed under {layout.scores_dir}; now rerun data_gen.build with the same "
            f"settings and --out {o}. The source's content hash was {files['content_hash']} (a hash of the shard "
            "files' bytes: equal where the pyarrow version is the same)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data_gen.scores_file", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="a finished dataset's scores to a .npz file")
    e.add_argument("data")
    e.add_argument("file")
    i = sub.add_parser("import", help="a scores file into a retrieved build directory of the same dataset")
    i.add_argument("file")
    i.add_argument("out")
    a = ap.parse_args(argv)
    try:
        print(export(a.data, a.file) if a.cmd == "export" else load_into(a.file, a.out))
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
