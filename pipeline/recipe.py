"""What a recipe (``configs/recipes/*.yaml``) names: the pipeline's settings groups, each checking itself.

Cheap to import (no torch): ``python -m pipeline --help`` and ``--print_plan`` read only this and the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ralm.documents import FORMATS
from ralm.settings import SettingsError, Text

STAGES = ("split", "index", "data", "fit", "judge", "eval", "report")
PRECISIONS = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class Source:
    """A text as the user has it.

    Args:
        file: A path: a text file (raw WikiText layout with `` = Title = `` headings, or plain UTF-8), a .jsonl
            file (Pyserini or BEIR records), a .tsv (MS MARCO's id<TAB>text, or with a header) or .csv file (with
            a header), each also .gz, a .parquet file, a Hugging Face dataset saved with save_to_disk, or a folder
            of .txt files (one document each, subfolders too); records are read as titled articles.
        dataset: Instead of a file, a Hugging Face hub dataset (rows joined as the raw file).
        name: The dataset's configuration.
        split: The dataset's split.
        format: auto (told by the path), text, jsonl, beir, tsv, csv, parquet, hf_disk or txt_dir.
        fields: The records' columns of id, title and text where they are not the usual names, e.g.
            {id: doc_no, text: passage_text}.
        articles: [first, end]: only these titled articles, in text order (0-based, end excluded).
    """

    file: str | None = None
    dataset: str | None = None
    name: str | None = None
    split: str = "train"
    format: str = "auto"
    fields: dict[str, str] | None = None
    articles: list[int] | None = None

    def __post_init__(self) -> None:
        problems = []
        if bool(self.file) == bool(self.dataset):
            problems.append("give one of file and dataset")
        if self.format not in FORMATS:
            problems.append(f"format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.articles is not None and (len(self.articles) != 2 or not 0 <= self.articles[0] < self.articles[1]):
            problems.append(f"articles {self.articles} must be [first, end] with 0 <= first < end")
        if problems:
            raise SettingsError(f"a text ({self.file or self.dataset}): " + "; ".join(problems))

    @property
    def as_is(self) -> bool:
        """A plain text or a hub dataset read whole: the commands can read it where it is."""
        return self.articles is None and not self.fields and (self.dataset is not None or
                                                              self.format in ("auto", "text"))

    def text(self) -> Text:
        """The ``--text.*`` setting that reads this source where it is."""
        return Text(file=self.file) if self.file else Text(dataset=self.dataset, name=self.name, split=self.split)


@dataclass(frozen=True)
class Texts:
    """The texts the LM reads.

    Args:
        train: Where training prefixes are sampled.
        dev: Where settings are chosen (evaluated only if named in eval.texts).
        report: The texts results are reported on, by name (e.g. {eval: {...}, heldout: {...}}).
    """

    train: Source | None = None
    dev: Source | None = None
    report: dict[str, Source] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.train is None or not self.report:
            raise SettingsError("texts: a recipe needs texts.train and at least one texts.report text")
        bad = [n for n in self.report if not n.replace("-", "").replace("_", "").isalnum() or n in ("train", "dev")]
        if bad:
            raise SettingsError(f"texts.report: names {bad} must be letters, digits, - or _ (and not train or dev)")

    def named(self) -> dict[str, Source]:
        """Every text by its name: train, dev (if given), then the report texts."""
        return {"train": self.train, **({"dev": self.dev} if self.dev else {}), **self.report}


@dataclass(frozen=True)
class Corpus:
    """What retrieval searches.

    Args:
        file: Documents or passages to index (any format of texts.*: jsonl, beir, parquet and saved datasets
            are passages indexed as they are; text and .txt folders are articles cut into passages).
        format: auto, text, jsonl, beir, tsv, csv, parquet, hf_disk or txt_dir.
        fields: The records' columns of id, title and text where they are not the usual names, e.g.
            {id: doc_no, text: passage_text}.
        index: An existing Lucene index instead (a directory, or a Pyserini prebuilt name): no index stage.
        words: Words per passage when articles are cut.
        exclude: Documents that leave the corpus, by title or id (e.g. those that duplicate an evaluated text).
        exclude_file: The same, one title or id per line.
    """

    file: str | None = None
    format: str = "auto"
    fields: dict[str, str] | None = None
    index: str | None = None
    words: int = 100
    exclude: list[str] | None = None
    exclude_file: str | None = None

    def __post_init__(self) -> None:
        if self.file and self.index:
            raise SettingsError("corpus: give corpus.file (to index) or corpus.index (already built), not both")
        if self.format not in FORMATS:
            raise SettingsError(f"corpus.format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.words < 1:
            raise SettingsError(f"corpus.words must be >= 1 (got {self.words})")
        if self.index and (self.exclude or self.exclude_file):
            raise SettingsError("corpus.exclude needs a corpus to filter (corpus.file); an existing index is used as it is")


@dataclass(frozen=True)
class Split:
    """The leak-free related corpus, for texts whose articles have titles (docs/METHOD.md §5).

    Args:
        halves: Cut every titled article of every text in two between paragraphs: the first halves (of all the
            texts' files, whole) join the corpus, the second halves are what the LM reads. No passage then
            overlaps an evaluated token, and each evaluated article has its related text in the corpus.
        heldout_fraction: Training articles kept out of the training data, by a hash of their title (the same
            title always on the same side), written as texts/train-heldout.txt for judging on unread articles.
        seed: Seed of that hash.
    """

    halves: bool = False
    heldout_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.heldout_fraction < 1:
            raise SettingsError(f"split.heldout_fraction {self.heldout_fraction} must be in [0, 1)")


@dataclass(frozen=True)
class Data:
    """The LM-supervised training set (``python -m data_gen.build``).

    Args:
        config: data_gen.build's YAML (examples, k, lengths, batch sizes), or a list stacked in order (a base, then
            only what differs).
        set: More data_gen.build settings, by dotted name (e.g. {examples: 1000, retrieval.k: 4}).
        forbid: Report texts whose article titles training retrieval never returns.
        scores: Scores files (python -m data_gen.scores_file export) of this very dataset, whole or in parts:
            imported instead of scoring with the LM (the retrieval runs here; the files are checked against it);
            shards no file holds are scored.
    """

    config: str | list[str] | None = None
    set: dict[str, object] = field(default_factory=dict)
    forbid: list[str] = field(default_factory=list)
    scores: str | list[str] | None = None

    @property
    def configs(self) -> list[str]:
        return [] if not self.config else [self.config] if isinstance(self.config, str) else list(self.config)

    @property
    def scores_files(self) -> list[str]:
        return [] if not self.scores else [self.scores] if isinstance(self.scores, str) else list(self.scores)


@dataclass(frozen=True)
class Judge(Data):
    """The held-out judge (``python -m reranking.heldout``): every export and untrained start choosing among the
    LM-scored candidates of prefixes from the training articles no fit read (``split.heldout_fraction``), with
    paired intervals: thousands of examples for encoder passes alone, where settings (a fit's steps, say) may be
    chosen, as on a report text they may not.

    Args:
        config: data_gen.build's YAML of the judge's examples, or a list stacked in order (e.g. the training
            data's, with ``set: {examples: 1000}``).
        set: More data_gen.build settings, by dotted name.
        forbid: As data.forbid.
        scores: Scores files of this very dataset, as data.scores.
        against: Rows every row is also compared with: untrained (each fit's start) or a row's name.
    """

    against: list[str] = field(default_factory=lambda: ["untrained"])

    def __post_init__(self) -> None:
        if not self.config:
            raise SettingsError("judge.config: give data_gen.build's YAML of the judge's examples")


@dataclass(frozen=True)
class Fit:
    """One reranker recipe, trained once per seed (``python -m reranking.fit``).

    Args:
        name: Its name: exports rerankers/NAME (one seed) or rerankers/NAME-seedN, rows of the same names.
        configs: reranking.fit YAMLs, stacked in order (a base, then only what differs).
        set: More reranking.fit settings, by dotted name (e.g. {trainer.max_steps: 200}).
        seeds: Training seeds (--seed_everything).
        untrained: Also export its untrained start (0 steps, the first seed) as NAME-untrained: the ablation row
            that says what training adds (for a plain bi-encoder it ranks as the cosine row).
    """

    name: str
    configs: list[str] = field(default_factory=list)
    set: dict[str, object] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    untrained: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum() or "seed" in self.name:
            problems.append(f"name {self.name!r} must be letters, digits, - or _ (and not hold 'seed')")
        if not self.configs:
            problems.append("configs must name at least one reranking.fit YAML")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            problems.append(f"seeds {self.seeds} must be one or more distinct integers")
        if problems:
            raise SettingsError(f"fits ({self.name}): " + "; ".join(problems))

    def rows(self) -> list[str]:
        """The export (and evaluation row) name of each seed."""
        return [self.name] if len(self.seeds) == 1 else [f"{self.name}-seed{s}" for s in self.seeds]


@dataclass(frozen=True)
class Row:
    """A row of its own beside ``eval.rerankers``: a reranker read with settings of its own, e.g. the reference's
    BOS behaviour ({windows.bos: passage}), another LM ranking (zero-shot, {ranker.model: smollm2-135m}) or an
    export of another run (its directory as ``reranker``).

    Args:
        name: The row's name in the tables (letters, digits, - or _).
        reranker: What ``eval.ppl --reranker`` takes: none, bm25, zero-shot, oracle, ... or an export's directory.
        set: Its eval.ppl settings beyond ``eval.set``, by dotted name. A row with settings of its own neither
            takes nor lends LM scores (``eval.reuse``): its inputs differ from the other rows'.
    """

    name: str
    reranker: str
    set: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise SettingsError(f"eval.rows: name {self.name!r} must be letters, digits, - or _")
        if not self.reranker:
            raise SettingsError(f"eval.rows ({self.name}): give its reranker (e.g. bm25, or an export's directory)")


@dataclass(frozen=True)
class Evaluation:
    """The rerankers evaluated on each text (``python -m eval.ppl``).

    Args:
        config: eval.ppl's YAML (windows, k, batch size).
        set: More eval.ppl settings, by dotted name.
        rerankers: The rows, in the report's order: none, bm25, random, zero-shot, cosine, oracle, untrained (each
            fit's start) and trained (each fit's seeds); zero-shot-abstain and oracle-abstain may keep the window
            without a passage (the abstaining oracle: how much of retrieval's value is knowing when not to).
        texts: The texts evaluated (default: every report text; add dev to see it too).
        lm_rankers: The texts on which zero-shot and oracle run (k LM forwards a stride; default: every text).
        reuse: Rows take the LM scores an earlier row of the same text computed for the same input (zero-shot and
            oracle lend every candidate's): the same numbers, fewer forwards, but no cost figure of their own.
        rows: Rows of their own, after those of ``rerankers``: a reranker with settings of its own (:class:`Row`).
        lm: The LM that reads the texts, when it is not the one that scored the training data (the recipe's
            ``lm``): rerankers trained on one LM's preferences, read by another.
    """

    config: str | None = None
    set: dict[str, object] = field(default_factory=dict)
    rerankers: list[str] = field(default_factory=lambda: ["none", "bm25", "cosine", "untrained", "trained", "oracle"])
    texts: list[str] | None = None
    lm_rankers: list[str] | None = None
    reuse: bool = True
    rows: list[Row] = field(default_factory=list)
    lm: str | None = None

    def __post_init__(self) -> None:
        known = ("none", "bm25", "random", "zero-shot", "cosine", "oracle", "zero-shot-abstain", "oracle-abstain",
                 "untrained", "trained")
        bad = [r for r in self.rerankers if r not in known]
        if bad or not (self.rerankers or self.rows):
            raise SettingsError(f"eval.rerankers {bad or '[]'}: choose from {', '.join(known)}")


@dataclass(frozen=True)
class Report:
    """The report (report.md) of every evaluated text.

    Args:
        baselines: The rows each text's tables compare against (intervals, sign tests): bm25, none, cosine,
            zero-shot, untrained (each fit's start) or a row's name.
    """

    baselines: list[str] = field(default_factory=lambda: ["bm25"])
