"""What an ``eval.ppl`` run leaves behind, written so that nothing half-written passes as complete.

``OUT/`` holds ``strides.parquet`` (per stride: NLL, tokens, the article it scores, the chosen passage's
rank, id, title and text, whether its NLLs were reused from an earlier run), ``tokens.npz`` (per-token
NLL, token id, stride), ``plot.png`` (NLL along the text, chosen-rank histogram), ``results.md``,
``candidates.npz`` where the LM scored every candidate to choose (zero-shot, oracle: each candidate's
target NLLs, which later runs reuse, :mod:`eval.reuse`) and, written last, ``results.json``: the
perplexities, the run's identity and the sha256 of every other file.
A run is complete exactly when ``results.json`` exists and the hashes match (:func:`read_complete`); every
file is written to a temporary name and renamed, so a kill or a full disk leaves the previous state, never
a truncated file under a final name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import matplotlib
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ralm.files import atomic_write, file_sha256
from ralm.models import resolve
from ralm.retrieval import index_identity
from ralm.settings import RERANKER_NAMES, InputError, Retrieval

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

RESULTS = "results.json"
FILES = ("strides.parquet", "tokens.npz", "plot.png", "results.md")
CANDIDATES = "candidates.npz"



def default_output_dir(reranker: str) -> Path:
    """``runs/ppl/<reranker>``: each reranker's evaluation in its own directory."""
    if reranker in RERANKER_NAMES:
        return Path("runs/ppl") / reranker
    p = Path(reranker).resolve()
    return Path("runs/ppl") / f"predictive-{p.parent.name}-{p.name}".replace(".", "_")


def read_complete(out_dir: Path) -> dict | None:
    """The results of a complete run in ``out_dir`` (all files present, hashes matching), else ``None``."""
    p = out_dir / RESULTS
    if not p.is_file():
        return None
    try:
        res = json.loads(p.read_text())
        for name, digest in res.get("files", {}).items():
            if file_sha256(out_dir / name) != digest:
                return None
    except (OSError, ValueError):
        return None
    return res


def markdown_table(results: dict) -> str:
    rows = [("reranker", results["reranker"]), ("word-level ppl", f"{results['ppl_word']:.4f}"),
            ("token-level ppl", f"{results['ppl_token']:.4f}"), ("scored tokens", results["n_scored_tokens"]),
            ("words (spaces)", results["n_words"]), ("text tokens N", results["n_tokens"]),
            ("strides", results["n_strides"]), ("strides with a document", results["strides_with_document"]),
            ("strides without a document", results["strides_without_document"])]
    out = ["| metric | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    if results["chosen_rank_counts"]:
        out += ["", "| BM25 rank chosen | strides |", "|---|---|"]
        out += [f"| {r} | {n} |" for r, n in results["chosen_rank_counts"].items()]
    return "\n".join(out) + "\n"


def plot(path: Path, res, title: str) -> None:
    """NLL per stride along the text (smoothed) and the histogram of chosen BM25 ranks."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1]})
    per_tok = res.stride_nll / np.maximum(res.stride_n_tokens, 1)
    win = max(1, len(per_tok) // 100)
    smooth = np.convolve(per_tok, np.ones(win) / win, mode="valid")
    a.plot(np.arange(len(smooth)) + win // 2, smooth, lw=1)
    a.set(xlabel="stride", ylabel=f"NLL per token (mean of {win})", title=title)
    ranks = res.chosen_rank[res.chosen_rank >= 0]
    if ranks.size:
        counts = np.bincount(ranks)
        b.bar(np.arange(len(counts)), counts)
        b.set_xticks(np.arange(len(counts)))
    b.set(xlabel="BM25 rank chosen", ylabel="strides", title=f"no document: {int((res.chosen_rank < 0).sum())}")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def write_outputs(out_dir: Path, res, *, reranker: str, n_words: int, identity: dict, meta: dict,
                  article: np.ndarray | None = None) -> dict:
    """Write every output file, ``results.json`` last; returns the results."""
    ppl_strides = float(np.exp(res.nll_sum / n_words))
    ppl_tokens = float(np.exp(res.nll_sum_tokens / n_words))
    if not np.isclose(ppl_strides, ppl_tokens, rtol=1e-5):  # the reference's second computation
        raise AssertionError(f"perplexity summed per stride ({ppl_strides}) != per token ({ppl_tokens})")
    with_doc = res.chosen_rank >= 0
    ranks, counts = np.unique(res.chosen_rank[with_doc], return_counts=True)
    results = {
        "reranker": reranker, "ppl_word": ppl_strides, "ppl_token": res.perplexity(res.n_tokens),
        "ppl_word_from_tokens": ppl_tokens, "nll_sum": res.nll_sum,
        "n_scored_tokens": int(res.token_nll.size), "n_words": n_words, "n_tokens": res.n_tokens,
        "n_strides": int(res.stride_index.size),
        "strides_with_document": int(with_doc.sum()), "strides_without_document": int((~with_doc).sum()),
        "chosen_rank_counts": {int(r): int(c) for r, c in zip(ranks, counts)},
        "strides_reused": int(res.reused.sum()),
        "word_count_convention": "number of ' ' characters in the text (reference eval_lm.py)",
        **meta, "identity": identity,
    }
    (out_dir / RESULTS).unlink(missing_ok=True)  # from here until the end the run is not complete
    get = lambda attr: [getattr(p, attr) if p is not None else "" for p in res.chosen]  # noqa: E731
    columns = {} if article is None else {"article": article}  # resampling unit of eval.compare's intervals
    table = pa.table({
        "stride": res.stride_index, **columns, "nll": res.stride_nll, "n_tokens": res.stride_n_tokens,
        "chosen_rank": res.chosen_rank, "n_candidates": res.n_candidates, "chosen_docid": get("docid"),
        "chosen_title": get("title"), "chosen_text": get("text"), "reused": res.reused,
    })
    atomic_write(out_dir / "strides.parquet", lambda t: pq.write_table(table, t))
    def tokens(t):
        with open(t, "wb") as f:
            np.savez_compressed(f, nll=res.token_nll, token_id=res.token_ids, stride=res.token_stride)

    atomic_write(out_dir / "tokens.npz", tokens)
    atomic_write(out_dir / "plot.png", lambda t: plot(t, res, f"{reranker}: word ppl {ppl_strides:.3f}"))
    atomic_write(out_dir / "results.md", lambda t: Path(t).write_text(markdown_table(results)))
    files = FILES
    if len(res.cand_docid):
        def candidates(t):
            with open(t, "wb") as f:
                np.savez_compressed(f, stride=res.cand_stride, n_tokens=res.cand_n_tokens, nll=res.cand_nll,
                                    docid=np.frombuffer(json.dumps(res.cand_docid).encode(), dtype=np.uint8))

        atomic_write(out_dir / CANDIDATES, candidates)
        files += (CANDIDATES,)
    results["files"] = {name: file_sha256(out_dir / name) for name in files}
    atomic_write(out_dir / RESULTS, lambda t: Path(t).write_text(json.dumps(results, indent=2) + "\n"))
    return results


# ---------------------------------------------------------------- identity and resume


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def model_identity(spec: str) -> dict:
    """What the scores depend on in a model, cheaply: its config and its files' names and sizes."""
    r = resolve(spec)
    p = Path(r.path)
    if not p.is_dir():
        return {"spec": spec}
    files = {f.name: f.stat().st_size for f in sorted(p.iterdir()) if f.is_file()}
    cfg = (p / "config.json").read_text() if (p / "config.json").is_file() else ""
    return {"spec": spec, "path": str(p.resolve()), "gguf": r.gguf_file, "config": _digest(cfg), "files": _digest(files)}


def reranker_identity(reranker: str) -> dict:
    """A built-in reranker by name; a trained one by the sha256 of its files (not of a lock file)."""
    if reranker in RERANKER_NAMES:
        return {"name": reranker}
    p = Path(reranker)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    return {"path": str(p.resolve()), "sha256": _digest({f.name: file_sha256(f) for f in files})}


def retrieval_identity(retrieval: Retrieval, retrieval_file: str | None) -> dict:
    """Where the candidates come from: a retrieval file by content, or the index and the BM25 settings."""
    if retrieval_file:
        if not Path(retrieval_file).is_file():
            raise InputError(f"--retrieval_file {retrieval_file!r} does not exist")
        return {"file": str(Path(retrieval_file).resolve()), "sha256": file_sha256(retrieval_file),
                "k": retrieval.k}
    return {**asdict(retrieval), "index": index_identity(retrieval.index)}


def run_identity(*, model: str, reranker: str, text_source: str, body: str, windows: dict, chunk_strides: int,
                 dtype: str, seed: int, ranker: dict | None, retrieval: dict | None) -> dict:
    """What a run's results depend on: a rerun with the same identity resumes, another one is refused."""
    return {"model": model_identity(model), "reranker": reranker_identity(reranker),
            "text": {"source": text_source, "sha256": hashlib.sha256(body.encode()).hexdigest()},
            "windows": windows, "chunk_strides": chunk_strides, "dtype": dtype, "seed": seed, "ranker": ranker,
            "retrieval": retrieval}


def start_state(out: Path, identity: dict) -> dict | None:
    """Refuse another run's directory; return the results if this very run is already complete (None: score)."""
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
