"""Settings of ``python -m data_gen.build``: small dataclasses that check themselves.

Two kinds of settings:

* :class:`BuildConfig` decides *what* the dataset contains (LM, texts, index, s, ℓ, k, L, document
  budget, seed, example count, shard size). It is stored as ``config.json`` in the output directory
  on the first run; a later run with a different one into the same directory is refused.
* :class:`RunConfig` decides *how* it is computed (batch sizes, workers, devices, strategy). It can
  change between a killed run and its resume.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BuildError(Exception):
    """A problem with the user's input: the message names the input and the fix (exit status 2)."""


def _h(text: str, **kw) -> Any:
    return field(metadata={"help": text}, **kw)


@dataclass(frozen=True)
class BuildConfig:
    """What the training set contains. Every field is part of the dataset's identity."""

    examples: int = _h("number of training examples (sampled prefix positions)", default=300_000)
    seed: int = _h("seed of the position sampler", default=0)
    shard_size: int = _h("examples per output parquet shard (the unit of resume)", default=1_000)
    model: str = _h("frozen causal LM (hub name or local directory); its tokenizer is used too", default="gpt2")
    dataset: str = _h("Hugging Face dataset of the training text", default="wikitext")
    dataset_name: str | None = _h("its config name", default="wikitext-103-raw-v1")
    split: str = _h("its split", default="train")
    text_file: str | None = _h("local training text (raw WikiText layout) instead of the dataset", default=None)
    eval_dataset: str | None = _h("dataset whose ` = Title = ` articles are forbidden in retrieval "
                                  "(null: forbid nothing)", default="wikitext")
    eval_name: str | None = _h("its config name", default="wikitext-103-v1")
    eval_split: str = _h("its split", default="test")
    eval_text_file: str | None = _h("local evaluation text whose titles are forbidden (overrides eval_dataset)",
                                    default=None)
    index: str = _h("Lucene index directory (python -m ralm.corpus) or Pyserini prebuilt name",
                    default="wikipedia-dpr-100w")
    k1: float = _h("BM25 k1", default=0.9)
    b: float = _h("BM25 b", default=0.4)
    k: int = _h("BM25 candidates per example", default=16)
    stride: int = _h("s: target tokens per example (the retrieval stride)", default=4)
    query_tokens: int = _h("ℓ: the BM25 query is the decode of the last ℓ tokens before the targets", default=32)
    max_length: int = _h("L: LM window length (capped at the model's context)", default=1024)
    doc_max_tokens: int = _h("document budget: passages are cut to this many LM tokens", default=256)

    def __post_init__(self) -> None:
        problems = []
        for name in ("examples", "shard_size", "k", "stride", "query_tokens", "doc_max_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_length < 2:
            problems.append(f"--max-length must be >= 2, got {self.max_length}")
        elif self.doc_max_tokens >= self.max_length - self.stride:
            problems.append(
                f"--doc-max-tokens ({self.doc_max_tokens}) must be < --max-length - --stride "
                f"({self.max_length} - {self.stride}): a document may not overwrite the target tokens; "
                "lower --doc-max-tokens or raise --max-length")
        elif self.query_tokens > self.max_length - self.stride:
            problems.append(f"--query-tokens ({self.query_tokens}) must be <= --max-length - --stride")
        if self.k1 <= 0 or not 0 <= self.b <= 1:
            problems.append(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        if problems:
            raise BuildError("invalid build configuration:\n  " + "\n  ".join(problems))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def n_shards(self) -> int:
        return -(-self.examples // self.shard_size)

    def shard_ids(self, shard: int) -> range:
        return range(shard * self.shard_size, min((shard + 1) * self.shard_size, self.examples))


@dataclass(frozen=True)
class TrainerConfig:
    """Lightning Trainer flags for the scoring stage (1 GPU, N GPUs, several nodes: same command)."""

    accelerator: str = _h("cpu, gpu, cuda, auto", default="auto")
    devices: str = _h("number of devices, list, or 'auto'", default="auto")
    num_nodes: int = _h("number of nodes", default=1)
    strategy: str = _h("auto, ddp, ddp_spawn, ...", default="auto")

    def kwargs(self) -> dict:
        devices: Any = self.devices
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        return {"accelerator": self.accelerator, "devices": devices, "num_nodes": self.num_nodes,
                "strategy": self.strategy}


@dataclass(frozen=True)
class RunConfig:
    """How the dataset is computed; may change between a killed run and its resume."""

    out: str = _h("output directory (shards, manifest.json, config.json, work/)", default="checkpoints/data_gen")
    stage: str = _h("stop after this stage: sample | retrieve | all (= score and write the dataset). "
                    "Multi-node: run --stage retrieve once first, then the same command with --stage all on the nodes",
                    default="all")
    batch_examples: int = _h("examples per scoring step (each gives k+1 LM rows)", default=8)
    batch_size: int = _h("LM rows per forward pass", default=64)
    dtype: str = _h("auto (bf16 autocast on GPU), float32, bfloat16, float16", default="auto")
    num_workers: int = _h("DataLoader workers building scoring batches (spawned, never forked)", default=0)
    retrieval_batch: int = _h("queries per BM25 batch_search call", default=256)
    threads: int | None = _h("BM25 search threads (default: all cores)", default=None)
    keep_work: bool = _h("keep OUT/work (token cache, retrieval results) after the dataset is complete",
                         default=False)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        problems = []
        if self.stage not in ("all", "sample", "retrieve"):
            problems.append(f"--stage must be sample, retrieve or all, got {self.stage!r}")
        if self.batch_examples < 1 or self.batch_size < 1:
            problems.append(f"--batch-examples and --batch-size must be >= 1, got {self.batch_examples}, {self.batch_size}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            problems.append(f"--dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.num_workers < 0:
            problems.append(f"--num-workers must be >= 0, got {self.num_workers}")
        if problems:
            raise BuildError("invalid run settings:\n  " + "\n  ".join(problems))


def load_yaml(path: str | Path) -> dict:
    """A build YAML: BuildConfig and RunConfig fields at top level, Trainer flags under ``trainer:``."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise BuildError(f"--config {str(path)!r} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise BuildError(f"--config {str(path)!r} must be a mapping of settings, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(BuildConfig)} | {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BuildError(f"--config {str(path)!r}: unknown setting(s) {unknown}; see python -m data_gen.build --help")
    tr = data.get("trainer") or {}
    tknown = {f.name for f in dataclasses.fields(TrainerConfig)}
    if not isinstance(tr, dict) or set(tr) - tknown:
        raise BuildError(f"--config {str(path)!r}: trainer: may only set {sorted(tknown)}")
    return data


def split_settings(settings: dict) -> tuple[BuildConfig, RunConfig]:
    """Build both configs from one flat dict (``trainer`` nested); each validates itself."""
    bnames = {f.name for f in dataclasses.fields(BuildConfig)}
    build = BuildConfig(**{k: v for k, v in settings.items() if k in bnames})
    rdict = {k: v for k, v in settings.items() if k not in bnames and k != "trainer"}
    tr = TrainerConfig(**{k: (str(v) if k == "devices" else v) for k, v in (settings.get("trainer") or {}).items()})
    return build, RunConfig(**rdict, trainer=tr)


def identity(build: BuildConfig) -> str:
    return json.dumps(build.to_dict(), indent=2, sort_keys=True)
