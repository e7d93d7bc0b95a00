"""A recipe as the commands that carry it out: one :class:`Step` per command, in order, each with what marks
it done, so that ``--print_plan`` shows what a user could run by hand (or on a cluster) and the runner can
skip what a killed run finished.

Every step but the pipeline's own (split, report) is a real command of the project (``ralm.corpus``,
``data_gen.build``, ``data_gen.scores_file``, ``reranking.fit``, ``eval.ppl``, ``eval.compare``) with the
recipe's YAML and flags; each of them resumes after a kill by itself. Nothing here runs anything.

Layout of ``OUT`` (the recipe's ``out``)::

    texts/      the texts the split stage wrote (a text read where it is needs none)
    corpus/     the index stage's passages (jsonl/) and Lucene index (index/)
    data/       the training set (data_gen.build)
    logs/       TensorBoard: logs/FIT/seedN, logs/FIT/untrained
    rerankers/  exports: FIT (one seed) or FIT-seedN, and FIT-untrained
    ppl/TEXT/ROW/    each evaluation (eval.ppl); report/: report.md, tables and plots
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from data_gen.config import shard_file
from pipeline.recipe import STAGES, Corpus, Data, Evaluation, Fit, Judge, Report, Source, Split, Texts
from ralm.documents import PASSAGE_FORMATS, resolve_format
from ralm.settings import SettingsError
from ralm.shipped import locate

FIT_PRECISION = {"auto": "auto", "float32": "32-true", "bfloat16": "bf16-mixed"}
#: Rows that score every candidate with the LM to choose: they run first and lend every candidate's LM scores.
LENDERS = ("zero-shot", "oracle", "zero-shot-abstain", "oracle-abstain")


@dataclass(frozen=True)
class Step:
    """One command of the plan: ``python -m MODULE ARGV``; done when ``done`` exists (None: always run)."""

    stage: str
    title: str
    module: str
    argv: list[str]
    done: Path | None = None

    def command(self) -> str:
        return shlex.join(["python", "-m", self.module, *self.argv])

    def finished(self) -> bool:
        return self.done is not None and self.done.exists()


@dataclass(frozen=True)
class Recipe:
    """Every setting of a pipeline run (``python -m pipeline --help``)."""

    out: str
    lm: str | None
    encoder: str | None
    texts: Texts
    corpus: Corpus
    split: Split
    data: Data
    fits: list[Fit]
    eval: Evaluation
    report: Report
    judge: Judge | None = None
    precision: str = "auto"
    prepare: str | None = None
    argv: list[str] = field(default_factory=list)  # the command line, for the pipeline's own steps

    def __post_init__(self) -> None:
        # configs/... and demo/assets/... name the installed copy's files where no source tree is at hand
        object.__setattr__(self, "lm", locate(self.lm))
        object.__setattr__(self, "data", replace(self.data, config=[locate(c) for c in self.data.configs] or None))
        object.__setattr__(self, "eval", replace(self.eval, config=locate(self.eval.config),
                                                 lm=locate(self.eval.lm)))
        object.__setattr__(self, "fits", [replace(f, configs=[locate(c) for c in f.configs]) for f in self.fits])
        if self.judge:
            object.__setattr__(self, "judge", replace(self.judge, config=[locate(c) for c in self.judge.configs]))
            if not self.split.heldout_fraction:
                raise SettingsError("judge: its examples come from the training articles held out; give "
                                    "split.heldout_fraction > 0 (e.g. 0.5)")
            if len(self.judge.forbid) > 1 and sorted(self.judge.forbid) != sorted(self.data.forbid):
                raise SettingsError(f"judge.forbid {self.judge.forbid}: several texts must be data.forbid's (the "
                                    "split stage writes one texts/forbidden.txt)")
            bad = [a for a in self.judge.against if a != "untrained" and a not in self.exports()]
            if bad:
                raise SettingsError(f"judge.against {bad}: untrained or an export's name ({', '.join(self.exports())})")
        names = [f.name for f in self.fits]
        if not names or len(set(names)) != len(names):
            raise SettingsError(f"fits: give one or more fits with distinct names (got {names})")
        if not (self.corpus.file or self.corpus.index or self.split.halves):
            raise SettingsError("corpus: give corpus.file or corpus.index (or split.halves, whose first halves are "
                                "the corpus)")
        texts = self.texts.named()
        for what, got in (("eval.texts", self.eval.texts or []), ("eval.lm_rankers", self.eval.lm_rankers or []),
                          ("data.forbid", self.data.forbid), ("judge.forbid", self.judge.forbid if self.judge else [])):
            bad = [t for t in got if t not in texts or t == "train"]
            if bad:
                raise SettingsError(f"{what} {bad}: not a report text or dev (texts: {', '.join(texts)})")
        for what, path in (*(("data.config", c) for c in self.data.configs or [None]), ("eval.config", self.eval.config),
                           *(("judge.config", c) for c in (self.judge.configs if self.judge else [])),
                           *((f"fits.{f.name}.configs", c) for f in self.fits for c in f.configs)):
            if not path or not Path(path).is_file():
                raise SettingsError(f"{what}: {path!r} is not a file")
        for f in self.fits:
            _check_schedule(f)
        rows: set[str] = set()
        for text in self.eval_texts():
            names = [name for name, _ in self.rows(text)]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise SettingsError(f"eval.rows {twice}: a name another row of {text} has; give each row its own")
            rows |= set(names)
        bad = [b for b in self.report.baselines
               if not (b in rows or b == "untrained" and any(n.endswith("-untrained") for n in rows))]
        if bad:
            raise SettingsError(f"report.baselines {bad}: not an evaluated row (rows: {', '.join(sorted(rows))}); add "
                                "it to eval.rerankers (untrained: a fit with untrained: true) or leave it out")

    @property
    def root(self) -> Path:
        return Path(self.out)

    # ------------------------------------------------------------------ where things are
    def text_file(self, name: str) -> Path | None:
        """The file a text is read from: where it is, or the split stage's copy (None: a hub dataset)."""
        src = self.texts.named()[name]
        if src.as_is and not self.split.halves and not (name == "train" and self.split.heldout_fraction):
            return Path(src.file) if src.file else None
        return self.root / "texts" / f"{name}.txt"

    def text_flags(self, name: str, flag: str = "--text") -> list[str]:
        f = self.text_file(name)
        if f is not None:
            return [f"{flag}.file", str(f)]
        t = self.texts.named()[name].text()
        return [f"{flag}.dataset", str(t.dataset), f"{flag}.name", str(t.name), f"{flag}.split", t.split]

    def corpus_file(self) -> Path | None:
        """What the index stage indexes (None: an existing index)."""
        if self.corpus.index:
            return None
        if self.split.halves:
            return self.root / "texts" / "corpus.txt"
        if self.corpus.exclude or self.corpus.exclude_file:  # a filtered copy, records as records
            fmt = resolve_format(self.corpus.file, self.corpus.format, "corpus.file")
            return self.root / "texts" / ("corpus.jsonl" if fmt in PASSAGE_FORMATS else "corpus.txt")
        return Path(self.corpus.file)

    @property
    def index(self) -> str:
        return self.corpus.index or str(self.root / "corpus" / "index")

    def eval_texts(self) -> list[str]:
        return list(self.eval.texts or self.texts.report)

    def rows(self, text: str) -> list[tuple[str, list[str]]]:
        """``(row name, --reranker flags)`` of each evaluation of ``text``, in the report's order."""
        lm_texts = self.eval.lm_rankers if self.eval.lm_rankers is not None else self.eval_texts()
        out = []
        for r in self.eval.rerankers:
            if r == "trained":
                out += [(row, ["--reranker", str(self.root / "rerankers" / row)]) for f in self.fits for row in f.rows()]
            elif r == "untrained":
                out += [(f"{f.name}-untrained", ["--reranker", str(self.root / "rerankers" / f"{f.name}-untrained")])
                        for f in self.fits if f.untrained]
            elif r == "cosine":
                out.append(("cosine", ["--reranker", "cosine", *self.cosine_flags()]))
            elif r not in LENDERS or text in lm_texts:
                out.append((r, ["--reranker", r]))
        out += [(row.name, ["--reranker", row.reranker]) for row in self.eval.rows
                if row.reranker not in LENDERS or text in lm_texts]
        return out

    @property
    def reader(self) -> str | None:
        """The LM that reads the texts: ``eval.lm``, else the recipe's ``lm``."""
        return self.eval.lm or self.lm

    def inputs(self) -> list[tuple[str, str]]:
        """``(setting, path)`` of every file the recipe reads that no stage writes: the texts, the corpus, the
        scores files."""
        out = [(f"texts.{name}.file", src.file) for name, src in self.texts.named().items() if src.file]
        out += [("corpus.file", self.corpus.file)] if self.corpus.file else []
        out += [("data.scores", f) for f in self.data.scores_files]
        out += [("judge.scores", f) for f in (self.judge.scores_files if self.judge else [])]
        return out

    def exports(self) -> list[str]:
        """Every export's name (rerankers/NAME): each fit's untrained start, then its seeds."""
        return [row for f in self.fits for row in ([f"{f.name}-untrained"] if f.untrained else []) + f.rows()]

    def cosine_flags(self) -> list[str]:
        """The cosine row is the first fit's encoder, untrained, reading prefixes and passages of its lengths."""
        model = fit_settings(self.fits[0]).get("model", {})
        read = model.get("input") or {}
        flags = ["--ranker.model", str(self.encoder or model.get("encoder"))]
        for key in ("max_prefix_tokens", "max_passage_tokens"):
            if key in read:
                flags += [f"--ranker.input.{key}", str(read[key])]
        return flags

    def baselines(self, text: str) -> list[str]:
        names = [r for r, _ in self.rows(text)]
        out = []
        for b in self.report.baselines:
            for name in ([f"{f.name}-untrained" for f in self.fits if f.untrained] if b == "untrained" else [b]):
                if name in names and name not in out:
                    out.append(name)
        return out

    def own(self, stage: str) -> list[str]:
        """The pipeline's own command for one of its stages (as the user gave it, that stage alone)."""
        keep, skip = [], False
        for a in self.argv:
            if skip:
                skip = False
                continue
            if a in ("--stage", "--until"):
                skip = True
                continue
            if a.startswith(("--stage=", "--until=")) or a == "--print_plan" or a.startswith("--print_plan="):
                continue
            keep.append(a)
        return [*keep, "--stage", stage]


def stacked(configs: list[str], settings: dict[str, object]) -> dict:
    """YAMLs merged as the commands stack them (later files win key by key), then dotted ``settings``."""
    merged: dict = {}
    for path in configs:
        _merge(merged, yaml.safe_load(Path(path).read_text()) or {})
    for key, value in settings.items():
        _merge(merged, _nested(key, value))
    return merged


def fit_settings(fit: Fit) -> dict:
    """The fit's reranking.fit YAMLs merged, then its ``set``."""
    return stacked(fit.configs, fit.set)


def _check_schedule(fit: Fit) -> None:
    """A fit's steps and validation schedule, from its merged settings: a negative step count, or one that
    ends before the first validation (no best checkpoint, nothing monitored), is refused up front."""
    t = fit_settings(fit).get("trainer") or {}
    steps, every = t.get("max_steps"), t.get("val_check_interval")
    where = f"fits ({fit.name}): trainer.max_steps {steps}"
    if steps is not None and (not isinstance(steps, int) or steps < -1):
        raise SettingsError(f"{where} must be a whole number >= 0 (-1: no limit)")
    if isinstance(steps, int) and steps > 0 and isinstance(every, int) and every > steps:
        raise SettingsError(f"{where} ends before the first validation (trainer.val_check_interval {every}): the fit "
                            f"would never validate; set trainer.val_check_interval to at most {steps}")


def _merge(into: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _nested(dotted: str, value) -> dict:
    out: dict = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def flags(settings: dict[str, object]) -> list[str]:
    """``{a.b: v}`` as ``--a.b v`` (lists and maps as YAML flow, null as null)."""
    out = []
    for key, value in settings.items():
        out += [f"--{key}", value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
                .removesuffix("\n...").removesuffix(" ...")]
    return out


# ---------------------------------------------------------------------- the plan


def plan(r: Recipe) -> list[Step]:
    """Every step of the recipe, in order."""
    return [*_split(r), *_index(r), *_data(r), *_fits(r), *_judge(r), *_evals(r), *_report(r)]


def _split(r: Recipe) -> list[Step]:
    needed = [n for n in r.texts.named() if r.text_file(n) is not None and r.text_file(n).parent == r.root / "texts"]
    if not needed and r.corpus_file() in (None, Path(r.corpus.file or "")):
        return []
    return [Step("split", "texts and corpus", "pipeline", r.own("split"), None)]


def _index(r: Recipe) -> list[Step]:
    src = r.corpus_file()
    if src is None:
        return []
    fmt = "auto" if src != Path(r.corpus.file or "") else r.corpus.format
    fields = r.corpus.fields if src == Path(r.corpus.file or "") else None  # a split corpus is records no more
    argv = ["--text.file", str(src), *(["--format", fmt] if fmt != "auto" else []),
            *(["--fields", json.dumps(fields)] if fields else []),
            *(["--words", str(r.corpus.words)] if r.corpus.words != 100 else []), "--out", str(r.root / "corpus")]
    return [Step("index", "Lucene index", "ralm.corpus", argv, r.root / "corpus" / "corpus.json")]


def _data(r: Recipe) -> list[Step]:
    steps = _build(r, r.data, r.text_flags("train"), r.root / "data", "the training prefixes", "the training set")
    if r.judge:
        steps += _build(r, r.judge, ["--text.file", str(r.root / "texts" / "train-heldout.txt")],
                        r.root / "judge" / "data", "the held-out prefixes", "the judge's examples")
    return steps


def _build(r: Recipe, data: Data, text: list[str], out: Path, prefixes: str, what: str) -> list[Step]:
    """data_gen.build of ``data`` (the training set or the judge's examples) into ``out``: in one step, or from
    scores files in three (retrieval here, the scores imported, the set assembled and checked)."""
    forbid = data.forbid
    argv = [*(x for c in data.configs for x in ("--config", str(c))), *text,
            *(r.text_flags(forbid[0], "--eval_text") if len(forbid) == 1 else
              ["--eval_text.file", str(r.root / "texts" / "forbidden.txt")] if forbid else []),
            *(["--retrieval.forbid_eval_titles", "true"] if forbid else []),
            "--retrieval.index", r.index, "--out", str(out), "--scoring.dtype", r.precision,
            *(["--model", r.lm] if r.lm else []), *flags(data.set)]
    done = out / "manifest.json"
    if "first_shards" in data.set:  # a part of the dataset: done when its last shard is written
        build = stacked(data.configs, data.set)
        total = -(-int(build.get("examples", 300_000)) // int(build.get("shard_size", 1000)))
        done = out / shard_file(min(int(data.set["first_shards"]), total) - 1, total)
    if not data.scores:
        return [Step("data", f"{what}, LM-scored", "data_gen.build", argv, done)]
    return [Step("data", f"BM25 candidates of {prefixes}", "data_gen.build", [*argv, "--stage", "retrieve"], done),
            Step("data", "the LM's scores from the scores file", "data_gen.scores_file",
                 ["import", *data.scores_files, str(out)], done),
            Step("data", f"{what} assembled", "data_gen.build", argv, done)]


def _fits(r: Recipe) -> list[Step]:
    steps = []
    for f in r.fits:
        base = [a for c in f.configs for a in ("--config", str(c))]
        common = ["--data.data_dir", str(r.root / "data"), "--trainer.logger.init_args.save_dir", str(r.root / "logs"),
                  "--trainer.logger.init_args.name", f.name, "--trainer.precision", FIT_PRECISION[r.precision],
                  *(["--model.encoder", r.encoder] if r.encoder else []), *flags(f.set)]
        if f.untrained:
            target = r.root / "rerankers" / f"{f.name}-untrained"
            steps.append(Step("fit", f"{f.name}: the untrained start", "reranking.fit",
                              [*base, "--seed_everything", str(f.seeds[0]), *common, "--trainer.max_steps", "0",
                               "--trainer.logger.init_args.version", "untrained", "--export_dir", str(target)],
                              target / "reranker.json"))
        for seed, row in zip(f.seeds, f.rows()):
            target = r.root / "rerankers" / row
            steps.append(Step("fit", f"{f.name}: seed {seed}", "reranking.fit",
                              [*base, "--seed_everything", str(seed), *common,
                               "--trainer.logger.init_args.version", f"seed{seed}", "--export_dir", str(target)],
                              target / "reranker.json"))
    return steps


def _judge(r: Recipe) -> list[Step]:
    """reranking.heldout over every export (cheap: each export's choices are cached by its files' hashes, so
    the step always runs and takes in fits added since)."""
    if not r.judge:
        return []
    rows = r.exports()
    against = [x for a in r.judge.against for x in ([n for n in rows if n.endswith("-untrained")] if a == "untrained"
                                                    else [a])]
    cosine = r.cosine_flags() if "cosine" in r.eval.rerankers else []  # the report's cosine row, read alike
    argv = ["--data", str(r.root / "judge" / "data"),
            "--rerankers", "[" + ",".join(str(r.root / "rerankers" / n) for n in rows) + "]",
            *(["--cosine", *(f.replace("--ranker.input.", "--input.") for f in cosine[1:])] if cosine else []),
            "--k", str(fit_settings(r.fits[0]).get("data", {}).get("max_candidates", 8)),
            *(["--against", "[" + ",".join(against) + "]"] if against else []), "--by_article", "true",
            "--skip_missing", "true",  # with --stage judge: the fits done so far (a curve's, while it runs)
            "--out", str(r.root / "judge" / "judge.md")]
    return [Step("judge", "every export on the held-out examples", "reranking.heldout", argv),
            Step("judge", "the learning curve on the judge", "pipeline", r.own("judge"))]


def _evals(r: Recipe) -> list[Step]:
    steps = []
    for text in r.eval_texts():
        rows = r.rows(text)
        lenders: list[str] = []  # finished rows of this text whose LM scores later rows take (eval.ppl --reuse_from)
        # the LM rankers first, then none (whose windows the abstaining ones take), the abstaining ones, the rest
        first = ("zero-shot", "oracle", "none", "zero-shot-abstain", "oracle-abstain")
        own = {row.name: row.set for row in r.eval.rows}  # a row's own settings, after eval.set's
        for name, reranker in sorted(rows, key=lambda row: first.index(row[0]) if row[0] in first else len(first)):
            out = r.root / "ppl" / text / name
            alone = bool(own.get(name))  # other inputs than the other rows': it neither takes nor lends LM scores
            reuse = (["--reuse_from", "[" + ",".join(lenders) + "]"] if r.eval.reuse and lenders and not alone
                     and name not in ("none", "zero-shot", "zero-shot-abstain") else [])
            argv = ["--config", str(r.eval.config), *r.text_flags(text), "--retrieval.index", r.index, *reranker,
                    "--output_dir", str(out), "--cache_dir", str(r.root / "ppl" / text / "retrieval_cache"), *reuse,
                    "--scoring.dtype", r.precision, *(["--model", r.reader] if r.reader else []), *flags(r.eval.set),
                    *flags(own.get(name) or {})]
            steps.append(Step("eval", f"{text}: {name}", "eval.ppl", argv, out / "results.json"))
            if not alone and (name != "none" or any(row.endswith("-abstain") for row, _ in rows)):
                lenders.append(str(out))  # none lends its windows to the abstaining rows
    return steps


def _report(r: Recipe) -> list[Step]:
    steps = []
    for text in r.eval_texts():
        runs = [str(r.root / "ppl" / text / name) for name, _ in r.rows(text)]
        for base in r.baselines(text) or ["bm25"]:
            steps.append(Step("report", f"{text} against {base}", "eval.compare",
                              [*runs, "--baseline", base, "--out", str(r.root / "report" / text / f"vs-{base}")]))
    steps.append(Step("report", "report.md", "pipeline", r.own("report")))
    return steps


def select(steps: list[Step], stage: str | None, until: str | None) -> list[Step]:
    """The steps of one stage (``stage``), or of every stage up to and including ``until``."""
    for s in (stage, until):
        if s is not None and s not in STAGES:
            raise SettingsError(f"--stage / --until {s!r}: choose from {', '.join(STAGES)}")
    if stage is not None:
        return [s for s in steps if s.stage == stage]
    if until is not None:
        last = STAGES.index(until)
        return [s for s in steps if STAGES.index(s.stage) <= last]
    return steps


def describe(steps: list[Step], stale: dict[int, str] | None = None) -> str:
    """The plan as shell lines, stage by stage, marking what is done already (or stale: ``stale`` by step
    index, why)."""
    lines, stage = [], None
    for i, s in enumerate(steps):
        if s.stage != stage:
            stage = s.stage
            lines.append(f"\n# {stage}")
        why = (stale or {}).get(i)
        lines.append(s.command() + (f"   # stale: {why}" if why else "   # done" if s.finished() else ""))
    return "\n".join(lines).lstrip("\n") + "\n"


__all__ = ["Recipe", "Step", "plan", "select", "describe", "fit_settings", "flags", "Source", "Corpus", "Split",
           "Data", "Fit", "Evaluation", "Report", "Texts"]
