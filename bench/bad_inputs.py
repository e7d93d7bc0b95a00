"""Bad inputs, as a user makes them: each command must end with one line naming the input and the fix (exit 2),
no traceback, no advice to load a pickle unsafely, and nothing half-written left behind.

    python bench/bad_inputs.py            # about 2-3 minutes on 2 cores (tiny models and corpora made here)

Prints one row per case: the command, its exit status, its stderr's last line, and whether it passed (exit as
expected, one error line, no "Traceback", no "weights_only=False", no temporary files left). Offline: tiny
models, texts and corpora are made in a temporary folder.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
RECIPE = str(ROOT / "configs" / "recipes" / "demo.yaml")


def world(d: Path) -> dict[str, Path]:
    """Tiny models, a text and corpora in several (good and bad) forms."""
    import torch

    from ralm.tiny import make_bert, make_gpt2, train_tokenizer, wikitext_articles

    text = wikitext_articles(n_articles=6, seed=0)
    (d / "text.txt").write_text(text)
    lm = d / "lm"
    make_gpt2(lm, train_tokenizer([text], d / "tok"))
    pickled = d / "pickled-lm"
    pickled.mkdir()
    for f in lm.iterdir():
        if f.suffix != ".safetensors":
            (pickled / f.name).write_bytes(f.read_bytes())
    torch.save({"linear": torch.nn.Linear(2, 2)}, pickled / "pytorch_model.bin")
    make_bert(d / "bert", [text])
    from ralm.settings import EncoderInput
    from reranking.export import export
    from reranking.system import RerankerSystem

    export(RerankerSystem(encoder=str(d / "bert"), architecture="bi",
                          input=EncoderInput(max_prefix_tokens=16, max_passage_tokens=24)), d / "export")
    rows = [("7", "Tempest", "Full fathom five thy father lies"), ("8", "Lear", "Nothing will come of nothing")]
    (d / "marco.tsv").write_text("".join(f"{i}\t{t}\n" for i, _, t in rows))
    with gzip.open(d / "beir.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"_id": i, "title": h, "text": t}) + "\n" for i, h, t in rows)
    (d / "noheader.csv").write_text("a,b\n1,2\n")
    (d / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "contents": t}) + "\n" for i, _, t in rows))
    (d / "corrupt.parquet").write_bytes(b"PAR1" + os.urandom(64))
    (d / "fake.jsonl.gz").write_text("not gzip")
    (d / "a-file").write_text("x")
    return {"lm": lm, "pickled": pickled}


def cases(d: Path, m: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """``(what, python -m argv, expected exit status)``."""
    out = str(d / "out")
    return [
        ("recipe: eval.set windows.stride -4", ["pipeline", "--config", RECIPE, "--out", out, "--eval.set",
                                                "{windows.stride: -4}"], 2),
        ("recipe: a fit of -5 steps", ["pipeline", "--config", RECIPE, "--out", out, "--fits",
                                       "[{name: p, configs: [configs/demo/fit.yaml], set: {trainer.max_steps: -5}}]"], 2),
        ("recipe: a fit that never validates", ["pipeline", "--config", RECIPE, "--out", out, "--fits",
                                                "[{name: p, configs: [configs/demo/fit.yaml], set: {trainer.max_steps: 30}}]"], 2),
        ("recipe: a baseline nobody evaluates", ["pipeline", "--config", RECIPE, "--out", out, "--report.baselines",
                                                 "[random]"], 2),
        # the world's files where none was made (the checkout's runs/demo/world may exist)
        ("recipe: the demo before its world", ["pipeline", "--config", RECIPE, "--out", out, "--texts",
                                               "{train: {file: %s}, report: {eval: {file: %s}}}" % (
                                                   d / "world" / "train.txt", d / "world" / "eval.txt"),
                                               "--corpus", "{file: %s}" % (d / "world" / "corpus.txt")], 2),
        ("--texts.train.help", ["pipeline", "--texts.train.help"], 0),
        ("corpus: MS MARCO id<TAB>text", ["ralm.corpus", "--text.file", str(d / "marco.tsv"), "--out", str(d / "c1")], 0),
        ("corpus: BEIR .jsonl.gz", ["ralm.corpus", "--text.file", str(d / "beir.jsonl.gz"), "--out", str(d / "c2")], 0),
        ("corpus: a CSV without id/text header", ["ralm.corpus", "--text.file", str(d / "noheader.csv"), "--out",
                                                  str(d / "c3")], 2),
        ("corpus: --format parquet on JSONL", ["ralm.corpus", "--text.file", str(d / "corpus.jsonl"), "--format",
                                               "parquet", "--out", str(d / "c4")], 2),
        ("corpus: a corrupt parquet", ["ralm.corpus", "--text.file", str(d / "corrupt.parquet"), "--out",
                                       str(d / "c5")], 2),
        ("corpus: a .gz that is not gzip", ["ralm.corpus", "--text.file", str(d / "fake.jsonl.gz"), "--out",
                                            str(d / "c6")], 2),
        ("eval.retrieval_file --output a folder", ["eval.retrieval_file", "--output", str(d), "--retrieval.index",
                                                   str(d / "c1" / "index"), "--model", str(m["lm"])], 2),
        ("an LM whose weights are a code pickle", ["eval.ppl", "--model", str(m["pickled"]), "--text.file",
                                                    str(d / "text.txt"), "--reranker", "none", "--output_dir",
                                                    str(d / "p1")], 2),
        ("reranking.formats --out a file", ["reranking.formats", "--reranker", str(d / "export"), "--out",
                                            str(d / "a-file")], 2),
        ("reranking.formats of a folder that is no export", ["reranking.formats", "--reranker", str(d / "bert"),
                                                             "--out", str(d / "f2")], 2),
    ]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as tmp:
        d = Path(tmp)
        models = world(d)
        rows, failed = [], 0
        for what, argv, want in cases(d, models):
            before = set(d.rglob("*"))
            p = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=ENV, capture_output=True, text=True)
            said = [line for line in p.stderr.splitlines() if "error" in line.lower()]
            left = [str(f.relative_to(d)) for f in set(d.rglob("*")) - before  # a run's lock or temporary files
                    if f.name == ".lock" or f.name.endswith(".tmp")]
            ok = (p.returncode == want and "Traceback" not in p.stderr + p.stdout and "weights_only=False" not in
                  p.stderr and not left and (want == 0 or len(said) == 1))
            failed += not ok
            last = (said[-1] if said else (p.stderr.strip().splitlines() or ["-"])[-1])[:150].replace("|", "/")
            rows.append(f"| {what} | {p.returncode} (want {want}) | {last} | {'ok' if ok else 'FAIL'} |")
    print("| case | exit | what it said | |\n|---|---|---|---|\n" + "\n".join(rows))
    print(f"\n{len(rows) - failed} of {len(rows)} cases as they should be")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
