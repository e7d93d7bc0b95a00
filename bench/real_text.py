"""Retrieval-augmented perplexity of a real pretrained LM (SmolLM2-135M) on real text (WikiText test).

    python bench/real_text.py                 # CPU-sized (about 20-30 minutes on 2 cores)
    python bench/real_text.py --full          # paper settings (L 1024, stride 4, k 16, budget 256): a GPU job
    python bench/real_text.py --reranker checkpoints/reranker/version_0/reranker   # adds a predictive row

Every number comes from the real commands (``python -m ralm.corpus``, ``python -m eval.ppl``,
``python -m eval.compare``), run as subprocesses; their outputs stay under ``--out``. Two tables:

A. **Other articles.** The corpus is WikiText-2 train (600 articles, none of them a test article);
   the evaluated text is the start of WikiText-2 test. Few passages are related to the evaluated
   text, so a document mostly displaces context.
B. **Related, leak-free.** For each evaluated test article, its first half is indexed and only its
   second half is evaluated (headings kept on both sides). No passage overlaps the evaluated text,
   but related text — the same article's earlier part — exists, as it would for a corpus that
   covers the evaluated topics. Titles are therefore not forbidden in B (they are in A).

Needs ``../shared/data`` (WikiText-2) and ``python -m ralm.models fetch smollm2-135m``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def split_halves(text: str, max_chars: int) -> tuple[str, str, int]:
    """(first halves, second halves, articles) of the first test articles whose second halves add up
    to ``max_chars`` characters (``ralm.corpus.article_halves``)."""
    sys.path.insert(0, str(ROOT))
    from ralm.corpus import article_halves

    first, second, used = [], [], 0
    for _, a, b in article_halves(text):
        first.append(a)
        second.append(b)
        used += len(b)
        if used >= max_chars:
            break
    return "".join(first), "".join(second), len(first)


def run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    t = time.time()
    subprocess.run([sys.executable, *cmd], check=True, cwd=ROOT)
    print(f"  ({time.time() - t:.0f} s)", flush=True)


def table(name: str, out: Path, text: Path, index: Path, settings: list[str], rerankers: list[str],
          forbid: bool) -> None:
    runs = []
    for r in rerankers:
        d = out / name / Path(r).name
        run(["-m", "eval.ppl", "--model", MODEL, "--text.file", str(text), "--retrieval.index", str(index),
             "--reranker", r, "--output_dir", str(d), "--cache_dir", str(out / name / "retrieval_cache"),
             "--retrieval.forbid_eval_titles", str(forbid).lower(), *settings])
        runs.append(str(d))
    run(["-m", "eval.compare", *runs, "--out", str(out / name)])


def main(argv: list[str] | None = None) -> int:
    global MODEL
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", default="runs/real_text")
    ap.add_argument("--chars", type=int, default=5000, help="characters of evaluated text per table")
    ap.add_argument("--full", action="store_true", help="paper settings and the whole test split (GPU)")
    ap.add_argument("--reranker", action="append", default=[], help="also evaluate this trained reranker")
    ap.add_argument("--devices", default="1")
    ap.add_argument("--tables", default="A,B", help="which tables to run (A, B or A,B)")
    a = ap.parse_args(argv)
    MODEL = a.model
    if not (SHARED / "wikitext-2-raw" / "wiki.test.raw").is_file():
        print(f"needs {SHARED} (WikiText-2 test and train)", file=sys.stderr)
        return 2
    out = (ROOT / a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    test = (SHARED / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")
    chars = len(test) if a.full else a.chars
    if a.full:
        settings = ["--windows.max_length", "1024", "--windows.stride", "4", "--retrieval.k", "16",
                    "--windows.doc_max_tokens", "256", "--windows.zero_shot_tokens", "16", "--scoring.dtype", "auto"]
    else:
        settings = ["--windows.max_length", "256", "--windows.stride", "32", "--retrieval.k", "4",
                    "--windows.doc_max_tokens", "96", "--windows.zero_shot_tokens", "16", "--scoring.batch_size", "8",
                    "--scoring.dtype", "float32"]  # the README's tables are float32's (auto is bf16 on some CPUs)
    settings += ["--trainer.devices", a.devices]
    rerankers = ["none", "bm25", "zero-shot", "oracle", *a.reranker]
    print(f"settings: {' '.join(settings)}", flush=True)

    tables = a.tables.split(",")
    if "A" in tables:
        run_a(out, test, chars, settings, rerankers)
    if "B" in tables:
        run_b(out, test, chars, settings, rerankers)
    for name in tables:
        print(f"\n## {name}\n" + (out / name / "comparison.md").read_text())
    return 0


def run_a(out: Path, test: str, chars: int, settings: list[str], rerankers: list[str]) -> None:
    """A: WikiText-2 train as the corpus, the start of test evaluated (test titles forbidden)."""
    text_a = out / "A_eval.txt"
    cut = test.index("\n", chars) + 1 if chars < len(test) else len(test)  # at a line end
    text_a.write_text(test[:cut], encoding="utf-8")
    if not (out / "A_corpus" / "index").is_dir():
        run(["-m", "ralm.corpus", "--text.file", str(SHARED / "wikitext-2-tokens" / "wiki.train.tokens"),
             "--out", str(out / "A_corpus")])
    table("A", out, text_a, out / "A_corpus" / "index", settings, rerankers, forbid=True)


def run_b(out: Path, test: str, chars: int, settings: list[str], rerankers: list[str]) -> None:
    """B: each article's first half indexed, its second half evaluated."""
    first, second, n = split_halves(test, chars)
    (out / "B_corpus.txt").write_text(first, encoding="utf-8")
    (out / "B_eval.txt").write_text(second, encoding="utf-8")
    print(f"B: {n} articles, {len(first):,} characters indexed, {len(second):,} evaluated", flush=True)
    if not (out / "B_corpus" / "index").is_dir():
        run(["-m", "ralm.corpus", "--text.file", str(out / "B_corpus.txt"), "--out", str(out / "B_corpus")])
    table("B", out, out / "B_eval.txt", out / "B_corpus" / "index", settings, rerankers, forbid=False)


MODEL = "smollm2-135m"

if __name__ == "__main__":
    sys.exit(main())
