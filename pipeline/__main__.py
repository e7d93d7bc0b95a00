"""``python -m pipeline --config configs/recipes/NAME.yaml``: your LM, your corpus, one command.

    python -m pipeline --config configs/recipes/demo.yaml                  # the offline demo
    python -m pipeline --config configs/recipes/demo.yaml --print_plan     # the commands, to run by hand
    python -m pipeline --config my-recipe.yaml --until data                # split, index and data only
    python -m pipeline --config my-recipe.yaml --stage report              # the report again
    python -m pipeline --config configs/recipes/demo.yaml --verify         # the finished run against its expected

A recipe names the causal LM, the reranker's encoder, the corpus, the texts (train, dev, report), the split,
the training data, the fits (stacked reranking.fit configs, seeds), optionally a held-out judge, the rerankers
to evaluate and the baselines of the report. The stages, in order: split (texts and corpus written where the
commands read them), index (ralm.corpus), data (data_gen.build), fit (reranking.fit per fit and seed, and each
fit's untrained start), judge (reranking.heldout over every export, where the recipe has a judge), eval
(eval.ppl per text and reranker) and report (eval.compare per text and baseline, then OUT/report/report.md). Each is the project's own command (--print_plan lists them); a finished step is
skipped, and a killed or stopped one continues where it was when the same command is run again.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from pipeline.recipe import PRECISIONS, Corpus, Data, Evaluation, Fit, Judge, Report, Split, Texts
from ralm.cli import run
from ralm.settings import SettingsError


def pipeline(out: str = "runs/pipeline", lm: str | None = None, encoder: str | None = None,
             texts: Texts | None = None, corpus: Corpus = Corpus(), split: Split = Split(), data: Data = Data(),
             fits: list[Fit] | None = None, judge: Judge | None = None, eval: Evaluation = Evaluation(),
             report: Report = Report(), precision: str = "auto", prepare: str | None = None,
             expected: str | None = None, stage: str | None = None, until: str | None = None,
             print_plan: bool = False, verify: bool = False, expect: bool = False) -> int:
    """Run a recipe (finished steps are kept), or print its plan.

    Args:
        out: Where everything goes (texts/, corpus/, data/, logs/, rerankers/, ppl/, report/, pipeline.log).
        lm: The frozen causal LM (a short name of python -m ralm.models, a local directory, a .gguf file or a hub
            id); default: the data and eval configs' model.
        encoder: The reranker's starting encoder (e.g. minilm-l6); default: the fit configs' model.encoder.
        texts: The texts the LM reads: train, dev and the report texts.
        corpus: What retrieval searches: a file to index (any format) or an existing index.
        split: The leak-free article-halves split, and training articles held out.
        data: The training set: data_gen.build's config and overrides, forbidden texts, or a scores file.
        fits: The rerankers to train: stacked reranking.fit configs, overrides and seeds each.
        judge: The held-out judge: every export choosing among LM-scored candidates of held-out training articles.
        eval: The rows evaluated on each text: eval.ppl's config and the rerankers.
        report: The baselines each text's tables compare against.
        precision: auto (bf16 where the hardware runs it natively, float32 elsewhere), float32 or bfloat16,
            for every stage.
        prepare: The command that makes the recipe's input files (e.g. the demo's world): an input that is
            missing when the pipeline starts is named with it.
        expected: The recipe's expected results (configs/recipes/NAME.expected.yaml): what --verify checks a
            finished run against, and where --expect records one (default: OUT/expected.yaml).
        stage: Run only this stage: split, index, data, fit, judge, eval or report.
        until: Run every stage up to and including this one.
        print_plan: Print the commands (marking those done) and run nothing.
        verify: Run nothing; check the finished run's tables against the expected results: a line per figure,
            OK / OKISH / FAIL, exit status 1 on any FAIL.
        expect: Run nothing; record the finished run's tables as a measurement of the expected results.
    """
    from pipeline.plan import Recipe, describe, plan, select  # yaml and the stages' settings only
    from pipeline.stamps import Ledger
    from pipeline.runner import run as run_plan  # the stages: torch, Lightning

    if precision not in PRECISIONS:
        raise SettingsError(f"--precision {precision!r}: choose from {', '.join(PRECISIONS)}")
    if stage is not None and until is not None:
        raise SettingsError("give --stage (one stage) or --until (every stage up to one), not both")
    if texts is None or not fits:
        raise SettingsError("a recipe needs texts and fits: pass --config configs/recipes/NAME.yaml (see --help)")
    recipe = Recipe(out=out, lm=lm, encoder=encoder, texts=texts, corpus=corpus, split=split, data=data, fits=fits,
                    judge=judge, eval=eval, report=report, prepare=prepare, precision=precision, argv=_argv())
    if verify or expect:
        return _expected(recipe, expected, verify)
    steps = select(plan(recipe), stage, until)
    if print_plan:
        ledger = Ledger(recipe, plan(recipe))
        print(describe(steps, {i: why for i, s in enumerate(steps) if (why := ledger.stale(s, adopt=False))}), end="")
        return 0
    return run_plan(recipe, steps)


def _expected(recipe, path: str | None, verify: bool) -> int:
    """--verify (print each figure's grade; 1 on any FAIL) or --expect (record the run as a measurement)."""
    from pathlib import Path

    from pipeline import expected as ex
    from pipeline.report import machine
    from ralm.shipped import locate

    precision, device = ex.run_kind(recipe.root, recipe.precision)
    target = Path(locate(path)) if path else recipe.root / "expected.yaml"
    if verify:
        head, lines = ex.verify(ex.load(target), recipe.root, ex.kind(precision, device))
        print(ex.report_text(head, lines), end="")
        return 1 if any(x.grade == "FAIL" for x in lines) else 0
    argv = [a for a in _argv() if a not in ("--expect", "--verify")]
    m = ex.measure(recipe.root, recipe.eval_texts(), precision, device, "python -m pipeline " + " ".join(argv),
                   machine())
    configs = [b for a, b in zip(argv, argv[1:]) if a == "--config"]
    ex.record(target, configs[-1] if configs else "(the command line's settings)", m)
    print(f"recorded measurement {m['name']!r} ({len(m['tables'])} tables) in {target}")
    return 0


def _argv() -> list[str]:
    return list(_ARGV) if _ARGV is not None else sys.argv[1:]


_ARGV: list[str] | None = None
FLAGS = ("--print_plan", "--verify", "--expect")


#: The recipe's lists of settings groups, each with the value that empties it.
LISTS = {"fits": "null", "eval.rows": "[]"}


def _lists_in(cfg: object) -> list[str]:
    """The lists of :data:`LISTS` a config's settings give."""
    out = []
    for key in LISTS:
        node = cfg
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out.append(key)
    return out


def _lists_replace(args: list[str]) -> list[str]:
    """A list of settings groups (``fits``, ``eval.rows``) that a later config or flag gives replaces the earlier
    one whole. jsonargparse merges a list item by item into an earlier list of the same length, so an overlay's
    second fit silently took the base recipe's second fit's ``set`` (its loss); emptying the list before each
    config or flag that gives one keeps every item as written."""
    out = []
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name == "--config":
            f = Path(value if eq else args[i + 1] if i + 1 < len(args) else "")
            try:
                keys = _lists_in(yaml.safe_load(f.read_text()) if f.is_file() else None)
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                keys = []  # jsonargparse names what is wrong with it
        else:
            keys = [name[2:]] if name.startswith("--") and name[2:] in LISTS else []
        for key in keys:
            out += [f"--{key}", LISTS[key]]
        out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    global _ARGV
    _ARGV = sys.argv[1:] if argv is None else list(argv)
    args = [a for i, a in enumerate(_ARGV) for a in ((a, "true") if a in FLAGS and (
        i + 1 == len(_ARGV) or _ARGV[i + 1].startswith("--")) else (a,))]  # a bare --print_plan etc., as a flag
    return run(pipeline, _lists_replace(args), "python -m pipeline", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
