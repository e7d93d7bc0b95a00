"""``eval.ppl`` with the reranker blind to given strings: what a learned taste for them costs on text.

    python bench/unk_ablation.py --strip '<unk>' -- --config configs/real/ppl.yaml --text.file runs/real/texts/report.txt \\
        --retrieval.index runs/real/corpus/index --reranker runs/gpu/rerankers/bi_bm25_art_exp-seed0 \\
        --output_dir runs/real/ppl/report/bi_bm25_art_exp-seed0-nounk --reuse_from runs/real/ppl/report/bm25

WikiText-2 train is here only in its ``<unk>`` version, so a reranker trained on it can learn that a
passage holding ``<unk>`` (a train article's first half) makes ``<unk>`` in the target likely, which a raw
test text never rewards (README, "On a GPU: the loss that trains"). This runs ``eval.ppl`` unchanged
except that the reranker reads each prefix and candidate with the ``--strip`` strings removed; the LM
still reads the passage as stored, so the perplexity is the same loop's. A diagnostic, not a setting:
the reranker was trained reading those strings (a reranker trained blind to them has ``--model.drop``,
which its export keeps). The output directory gets ``STRIPPED.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Blind:
    """A selector that reads ``StrideBatch`` texts with ``strings`` removed; returns the inner one's picks."""

    def __init__(self, inner, strings: list[str]):
        self.inner, self.strings = inner, list(strings)

    def clean(self, text: str | None) -> str | None:
        from reranking.inputs import without

        return None if text is None else without([text], self.strings)[0]

    def blind(self, batch):
        from ralm.selectors import StrideBatch

        cands = [[dataclasses.replace(p, text=self.clean(p.text), contents=self.clean(p.contents)) for p in c]
                 for c in batch.candidates]
        return StrideBatch([self.clean(t) for t in batch.prefix_texts], cands, batch.stride_ids)

    def select(self, batch, lm_nll=None):
        return self.inner.select(self.blind(batch), lm_nll)

    def to(self, device):
        self.inner.to(device)
        return self

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, ppl_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strip", action="append", required=True, help="a string the reranker must not read (repeatable)")
    a = ap.parse_args(ours)
    if "--output_dir" not in ppl_args:
        raise SystemExit("give eval.ppl's arguments after --, with an --output_dir of its own")
    import eval.ppl as ppl

    make = ppl.make_selector
    ppl.make_selector = lambda *args, **kw: Blind(make(*args, **kw), a.strip)
    rc = ppl.main(ppl_args)
    out = Path(ppl_args[ppl_args.index("--output_dir") + 1])
    (out / "STRIPPED.json").write_text(json.dumps({"reranker_reads_without": a.strip}) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
