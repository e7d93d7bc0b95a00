"""What a ``data_gen.build`` dataset is, and how it is computed.

* :class:`BuildConfig` decides *what* the dataset contains (LM, texts, index and BM25 settings, s, ℓ,
  k, L, document budget, seed, example count, shard size). It is stored as ``OUT/config.json`` once the
  inputs have been checked; a later run with a different one into the same directory is refused.
* :class:`RunConfig` decides *how* it is computed (batch sizes, workers, devices). It may change
  between a killed run and its resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field

from ralm.settings import Devices, InputError, Retrieval, Scoring, Text, Windows


class BuildError(InputError):
    """A problem with the user's input: the message names the input and the fix (exit status 2)."""


def log(msg: str) -> None:
    """One progress or summary line of the build (stderr, flushed: it reaches a piped log at once)."""
    print(f"[data_gen] {msg}", file=sys.stderr, flush=True)


def load_text(text: Text, what: str) -> str:
    """``text``'s contents; a missing or unreadable one is a :class:`BuildError` naming ``--what``."""
    try:
        return text.load()
    except (FileNotFoundError, ValueError) as e:
        raise BuildError(f"--{what}: {e}") from None


@dataclass(frozen=True)
class Targets:
    """Several examples per LM window: a causal LM's forward over ``[d ; window]`` gives every later token's
    log-probability, so one row per candidate scores ``per_window`` consecutive targets of s tokens, each an
    example with its own prefix (METHOD §1, "Several targets per window").

    Args:
        per_window: m: targets scored from one window (1: one example per window, the paper's data). Target j of
            m (0-based) keeps the window's tokens before it as its prefix: (m - 1 - j) * s tokens fewer than a
            window of its own would give; the last target is exactly a one-target example.
        candidates: own: every target's own BM25 top k (the paper's protocol; the window scores the union of its
            targets' lists once); shared: one list per window, the first target's, for all its targets (k + 1
            rows for m examples; the later targets' candidates and BM25 scores are those of a query
            j * s tokens older than their own).
        extend: Lengthen the window by (m - 1) * s tokens, so that every target keeps at least the L - s prefix
            tokens of a one-target example (the first target is exactly one; later targets read more): the rows
            cost more, the examples differ less from one-target ones. false: the window stays L tokens.
    """

    per_window: int = 1
    candidates: str = "own"
    extend: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.per_window < 1:
            problems.append(f"--targets.per_window must be >= 1 (got {self.per_window})")
        if self.candidates not in ("own", "shared"):
            problems.append(f"--targets.candidates must be own or shared (got {self.candidates!r})")
        if problems:
            raise BuildError("invalid targets settings: " + "; ".join(problems))

    def scoring_window(self, length: int, stride: int) -> int:
        """Tokens per LM row: L, or L + (m - 1) * s with ``extend``."""
        return length + (self.per_window - 1) * stride if self.extend else length

    def window_end(self, example_id: int, position: int, stride: int) -> int:
        """End of the LM window that scores example ``example_id`` (target at ``position``): its window's
        last target ends there. Example ids of one window are consecutive: window w holds w*m .. w*m+m-1."""
        return position + (self.per_window - example_id % self.per_window) * stride


@dataclass(frozen=True)
class BuildConfig:
    """What the training set contains. Every field is part of the dataset's identity."""

    examples: int
    seed: int
    shard_size: int
    model: str
    text: Text
    eval_text: Text
    retrieval: Retrieval
    windows: Windows
    exclude_source: bool = True
    targets: Targets = field(default_factory=Targets)

    def __post_init__(self) -> None:
        problems = [f"--{n} must be >= 1 (got {getattr(self, n)})" for n in ("examples", "shard_size")
                    if getattr(self, n) < 1]
        m = self.targets.per_window
        problems += [f"--{n} ({getattr(self, n)}) must be a multiple of --targets.per_window ({m}): a window's "
                     "examples are scored together and stay in one shard" for n in ("examples", "shard_size")
                     if getattr(self, n) % m]
        if problems:
            raise BuildError("invalid build settings: " + "; ".join(problems))
        self.retrieval.check_windows(self.windows)

    def to_dict(self) -> dict:
        """The identity stored in config.json (s' and the stage-only flags are not part of it)."""
        d = dataclasses.asdict(self)
        d["windows"].pop("zero_shot_tokens")
        if self.windows.bos == Windows.bos:  # the default row start: the identity of datasets built before it existed
            d["windows"].pop("bos")
        if self.targets == Targets():  # one target per window: the identity of every dataset built before m existed
            d.pop("targets")
        return d

    def check_targets(self, window: int) -> None:
        """Every target's prefix holds the document and the query: doc budget < L - m*s and ℓ <= L - m*s."""
        m, s = self.targets.per_window, self.windows.stride
        room = window - m * s
        if m > 1 and (self.windows.doc_max_tokens >= room or self.retrieval.query_tokens > room):
            raise BuildError(f"--targets.per_window {m} leaves the first target L - m*s = {window} - {m}*{s} = {room} "
                             f"prefix tokens, which must exceed --windows.doc_max_tokens ({self.windows.doc_max_tokens}) "
                             f"and hold --retrieval.query_tokens ({self.retrieval.query_tokens}); lower "
                             "--targets.per_window or --windows.doc_max_tokens, or raise --windows.max_length")

    @property
    def n_shards(self) -> int:
        return -(-self.examples // self.shard_size)

    def shard_ids(self, shard: int) -> range:
        return range(shard * self.shard_size, min((shard + 1) * self.shard_size, self.examples))


def shard_file(i: int, n_shards: int) -> str:
    """The file name of shard ``i`` of a dataset of ``n_shards`` (under its ``--out``)."""
    return f"train-{i:05d}-of-{n_shards:05d}.parquet"


@dataclass(frozen=True)
class RunConfig:
    """How the dataset is computed; may change between a killed run and its resume."""

    out: str
    stage: str = "all"
    batch_examples: int = 8
    scoring: Scoring = field(default_factory=Scoring)
    num_workers: int = 0
    retrieval_batch: int = 256
    keep_work: bool = False
    trainer: Devices = field(default_factory=Devices)
    verbose: bool = False
    progress: bool = True
    first_shards: int | None = None  # score and write only the first N shards (a part of the dataset), then stop

    def __post_init__(self) -> None:
        problems = []
        if self.stage not in ("all", "sample", "retrieve"):
            problems.append(f"--stage must be sample, retrieve or all (got {self.stage!r})")
        if self.first_shards is not None and self.first_shards < 1:
            problems.append(f"--first_shards must be >= 1 (got {self.first_shards})")
        for n in ("batch_examples", "retrieval_batch"):
            if getattr(self, n) < 1:
                problems.append(f"--{n} must be >= 1 (got {getattr(self, n)})")
        if self.num_workers < 0:
            problems.append(f"--num_workers must be >= 0 (got {self.num_workers})")
        if problems:
            raise BuildError("invalid run settings: " + "; ".join(problems))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def same_setting(a, b) -> bool:
    """Equal, or two spellings (relative / absolute) of one existing file or directory."""
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str) and a and b and os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return False


def config_diff(stored: dict, build: BuildConfig) -> list[str]:
    """``key: stored X, now Y`` for every setting that differs (dotted keys for nested groups)."""
    old, new = _flat(stored), _flat(build.to_dict())
    return [f"{k}: stored {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(set(old) | set(new))
            if not same_setting(old.get(k), new.get(k))]


def identity_json(build: BuildConfig) -> str:
    return json.dumps(build.to_dict(), indent=2, sort_keys=True)
