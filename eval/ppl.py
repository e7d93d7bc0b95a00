"""``python -m eval.ppl``: retrieval-augmented perplexity with any reranker (docs/METHOD.md §2).

    python -m eval.ppl --reranker bm25          # paper settings: GPT-2, WikiText-103 test, BM25 over DPR
    python -m eval.ppl --config configs/ppl.yaml --reranker checkpoints/reranker/version_0/reranker
    python -m eval.ppl --model smollm2-135m --text.file eval.txt --retrieval.index corpus/index --reranker oracle
    python -m eval.ppl --config configs/ppl.yaml --reranker zero-shot --trainer.devices 8 --trainer.strategy ddp

Rerankers: none, bm25, random, zero-shot (the evaluated LM ranks, or ``--ranker.model``), oracle,
cosine (``--ranker.model``'s mean-pooled embeddings, no training), or the path of a trained reranker
(an export directory or a Lightning ``.ckpt`` of ``reranking.fit``).

The strides are scored in chunks through Lightning's ``Trainer.predict`` (one device, N devices and
several nodes are the same command with ``--trainer.*`` flags), and each chunk's result is saved
under ``OUTPUT_DIR/work`` as soon as it exists: rerunning the same command after a kill continues
where it stopped and gives bit-identical results. The outputs (results.json last, see
``eval/results.py``) replace nothing until they are complete; an output directory holding another
run's work or results is refused rather than overwritten. The work is :func:`eval.perplexity.evaluate`'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ralm.cli import parse, run
from ralm.settings import WIKITEXT103_TEST, Devices, Ranker, Retrieval, Scoring, Text, Windows


def ppl(model: str = "gpt2", reranker: str = "bm25", text: Text = WIKITEXT103_TEST, retrieval: Retrieval = Retrieval(),
        retrieval_file: str | None = None, windows: Windows = Windows(), ranker: Ranker = Ranker(),
        scoring: Scoring = Scoring(), trainer: Devices = Devices(), output_dir: str | None = None,
        cache_dir: str | None = None, save_retrieval_file: str | None = None, chunk_strides: int = 64, seed: int = 0,
        keep_work: bool = False, reuse_from: list[str] | str | None = None, verbose: bool = False,
        progress: bool = True) -> dict:
    """Retrieval-augmented perplexity of a causal LM with one reranker.

    Args:
        model: The frozen causal LM: a short name (python -m ralm.models list), a local directory, a .gguf
            file or a hub id.
        reranker: none | bm25 | random | zero-shot | oracle | cosine | the path of a trained reranker; or
            zero-shot-abstain | oracle-abstain, which also score the window without a passage and keep it where
            no candidate does better (the abstaining oracle is never worse than none: an upper bound).
        text: The evaluation text.
        retrieval: BM25 candidates (``retrieval.index``); unused with ``retrieval_file``.
        retrieval_file: Candidates from a reference-format retrieval JSON file instead of an index.
        windows: Stride, window, document budget and zero-shot's s'.
        ranker: Settings of rerankers with a model of their own (zero-shot with another LM, cosine, predictive).
        scoring: LM batch size, compute dtype, and the placement of an LM larger than one device.
        trainer: Lightning devices for the scoring (--trainer.devices 8 --trainer.strategy ddp).
        output_dir: Where the results go (default: runs/ppl/<reranker>).
        cache_dir: Retrieval cache (default: <output_dir>/../retrieval_cache, shared by sibling runs).
        save_retrieval_file: Also write the candidates used, in the reference's JSON format.
        chunk_strides: Strides per chunk: the unit of batching, of saved progress and of work per device.
        seed: Seed of the random reranker.
        keep_work: Keep OUTPUT_DIR/work (per-chunk results) after the run is complete.
        reuse_from: A finished run (or a list, ``'[DIR1,DIR2]'``) on the same text, LM, windows, precision
            and candidates, e.g. the bm25 run: a stride whose chosen passage is the one such a run chose
            takes that run's target NLLs instead of an LM forward (the same LM input; eval/reuse.py). A
            zero-shot or oracle run lends every candidate's (so an oracle reusing a zero-shot run, or any
            reranker reusing either, forwards almost nothing; oracle-abstain reusing an oracle and a none
            run forwards nothing). Not for zero-shot itself.
        verbose: Show library and Java logging.
        progress: Show progress (a bar on a terminal, periodic lines otherwise).
    """
    from eval.perplexity import evaluate  # torch, Lightning: seconds of imports that --help does without

    return evaluate(model=model, reranker=reranker, text=text, retrieval=retrieval, retrieval_file=retrieval_file,
                    windows=windows, ranker=ranker, scoring=scoring, trainer=trainer, output_dir=output_dir,
                    cache_dir=cache_dir, save_retrieval_file=save_retrieval_file, chunk_strides=chunk_strides,
                    seed=seed, keep_work=keep_work, reuse_from=reuse_from, verbose=verbose, progress=progress)


def check(argv: list[str]) -> None:
    """The settings of ``python -m eval.ppl ARGV`` checked without running it (the pipeline, up front)."""
    from eval.perplexity import check_settings

    check_settings(**parse(ppl, argv, PROG))


PROG = "python -m eval.ppl"


def _report(results: dict, kwargs: dict) -> int:
    if results:
        from eval.results import default_output_dir, markdown_table

        print(markdown_table(results))
        out = kwargs.get("output_dir") or default_output_dir(kwargs.get("reranker", "bm25"))
        print(f"results: {Path(out) / 'results.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(ppl, argv, PROG, description=__doc__, after=_report)


if __name__ == "__main__":
    sys.exit(main())
