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

    def __post_init__(self) -> None:
        problems = [f"--{n} must be >= 1 (got {getattr(self, n)})" for n in ("examples", "shard_size")
                    if getattr(self, n) < 1]
        if problems:
            raise BuildError("invalid build settings: " + "; ".join(problems))
        self.retrieval.check_windows(self.windows)

    def to_dict(self) -> dict:
        """The identity stored in config.json (s' and the stage-only flags are not part of it)."""
        d = dataclasses.asdict(self)
        d["windows"].pop("zero_shot_tokens")
        return d

    @property
    def n_shards(self) -> int:
        return -(-self.examples // self.shard_size)

    def shard_ids(self, shard: int) -> range:
        return range(shard * self.shard_size, min((shard + 1) * self.shard_size, self.examples))


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

    def __post_init__(self) -> None:
        problems = []
        if self.stage not in ("all", "sample", "retrieve"):
            problems.append(f"--stage must be sample, retrieve or all (got {self.stage!r})")
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
