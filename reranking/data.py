"""Training data for the reranker: parquet shards from ``data_gen`` → batches of (example, k candidates).

One row per example (see ``data_gen``'s manifest): ``id``, ``prefix_text``, ``doc_texts`` (k passages in
BM25 order, the exact strings the LM was conditioned on), ``lm_logprobs`` (log p_LM(y | d_j ; x) per
candidate), optionally ``nodoc_logprob``. The collator tokenizes with :meth:`reranking.inputs.InputFormat.encode`
(dynamic padding) and only real candidates become encoder rows; ``mask`` says where they go.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pyarrow.parquet as pq
import torch
from datasets import load_dataset
from datasets.exceptions import DatasetGenerationError
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader

from ralm.articles import hashed_below
from ralm.loading import load_tokenizer
from ralm.schema import TRAINING_COLUMNS
from ralm.settings import InputError, SettingsError
from reranking.inputs import InputFormat

REQUIRED_COLUMNS = tuple(c for c in TRAINING_COLUMNS if c != "nodoc_logprob")
OPTIONAL_COLUMNS = ("nodoc_logprob", "bm25_scores")  # bm25_scores: read by a reranker with a BM25 prior


def parquet_files(data_dir: str | os.PathLike) -> list[str]:
    """The ``*.parquet`` shards of ``data_dir`` (sorted), or an error saying how to make them."""
    d = Path(data_dir)
    files = sorted(glob.glob(str(d / "*.parquet")))
    if not files:
        found = sorted(p.name for p in d.iterdir())[:10] if d.is_dir() else None
        raise FileNotFoundError(
            f"no *.parquet shards in {str(d)!r} ({'missing directory' if found is None else f'contains {found}'}); "
            "generate training data with `python -m data_gen.build ...` and pass its output as --data.data_dir")
    return files


def check_shards(files: list[str], flag: str) -> None:
    """Each shard readable as parquet (its footer and schema: no data read) with the training columns; a bad one
    is one :class:`InputError` naming that shard (a truncated copy, another file, a shard of another schema)."""
    for f in files:
        try:
            names = pq.read_schema(f).names
        except (OSError, ValueError) as e:
            raise InputError(f"{flag}: {f} is not a readable parquet shard ({str(e).splitlines()[0][:160]}); it may be "
                             "truncated or not a data_gen.build shard: regenerate it (rerun data_gen.build)") from None
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise InputError(f"{flag}: {f} lacks the columns {missing} (has {names[:12]}); give the output of "
                             "data_gen.build, whose shards hold every candidate's log p(y | d; x)")


def _readable(path: str) -> bool:
    """Every page of a parquet file decodes (the footer alone may be intact in a damaged copy)."""
    try:
        pq.read_table(path)
        return True
    except (OSError, ValueError):
        return False


def is_validation(ids: np.ndarray, fraction: float, seed: int, per_window: int = 1) -> np.ndarray:
    """Deterministic held-out split by example id: hash(seed, id // per_window) → [0, 1) < fraction.

    Depends only on (id, seed), not on row order, shard layout or dataset size. The examples of one LM window
    (``data_gen.build --targets.per_window``: ids w*m .. w*m+m-1, one text and one candidate list) fall on one
    side together; with one target per window the hash is of the id itself, as it always was.
    """
    return hashed_below([int(x) // per_window for x in ids.tolist()], fraction, seed)


def targets_per_window(data_dir: str | os.PathLike) -> int:
    """m of the data_gen.build output in ``data_dir`` (its config.json; 1 when it records none)."""
    config = Path(data_dir) / "config.json"
    try:
        return int(json.loads(config.read_text()).get("targets", {}).get("per_window", 1))
    except (OSError, ValueError, AttributeError):
        return 1


class RerankCollator:
    """Turns a list of rows into a reranker batch (all tokenization happens here).

    Output keys (``B`` examples, ``k`` = most candidates in this batch, ``P`` = real pairs = ``mask.sum()``):
        the model's inputs from :meth:`InputFormat.encode` — cross-encoder: ``input_ids``,
        ``attention_mask`` (and maybe ``token_type_ids``), ``LongTensor[P, T]``; bi-encoder: ``query_*``
        ``[B, Tq]``, ``passage_*`` ``[P, Tp]`` and ``pair_query[P]`` — pairs in row-major (example,
        candidate) order; ``mask``: ``BoolTensor[B, k]``; ``lm_logprobs``:
        ``FloatTensor[B, k]`` (0 on padding); ``bm25``: the candidates' BM25 scores, ``FloatTensor[B, k]``
        (0 on padding; present when every row has ``bm25_scores``; read by a reranker with ``bm25_weight``);
        ``nodoc_logprob``: ``FloatTensor[B]`` (NaN if absent); ``ids``: ``LongTensor[B]``. A format that
        ``abstain``s ends each list with "no passage" (:meth:`InputFormat.with_no_passage`), whose LM
        log-probability is the row's ``nodoc_logprob``.
    """

    def __init__(self, tokenizer, fmt: InputFormat, max_candidates: int | None = None, padding: str = "longest"):
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.max_candidates = max_candidates
        self.padding = padding

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        docs = [list(r["doc_texts"])[: self.max_candidates] for r in rows]
        lps = [list(r["lm_logprobs"])[: len(d)] for r, d in zip(rows, docs)]
        for r, d, lp in zip(rows, docs, lps):
            if len(lp) != len(d) or not d:
                raise ValueError(f"example id={r['id']}: {len(d)} doc_texts but {len(lp)} lm_logprobs "
                                 "(need the same number, at least 1); regenerate this shard with data_gen")
        has_bm25 = all(r.get("bm25_scores") is not None for r in rows)
        bm25s = [list(r["bm25_scores"])[: len(d)] if has_bm25 else None for r, d in zip(rows, docs)]
        if self.fmt.abstain:
            missing = [r["id"] for r in rows if r.get("nodoc_logprob") is None]
            if missing:
                raise ValueError(f"examples {missing[:5]}: no nodoc_logprob, which a reranker that may abstain "
                                 "trains on; regenerate the data with data_gen.build or set --model.abstain false")
            lps = [[*lp, float(r["nodoc_logprob"])] for r, lp in zip(rows, lps)]
            docs, bm25s = map(list, zip(*(self.fmt.with_no_passage(d, s) for d, s in zip(docs, bm25s))))
        B, k = len(rows), max(len(d) for d in docs)
        mask = torch.zeros((B, k), dtype=torch.bool)
        lm = torch.zeros((B, k), dtype=torch.float32)
        bm25 = torch.zeros((B, k), dtype=torch.float32) if has_bm25 else None
        passages, pair_prefix = [], []
        for b, (d, lp, s) in enumerate(zip(docs, lps, bm25s)):
            mask[b, : len(d)] = True
            lm[b, : len(d)] = torch.tensor(lp, dtype=torch.float32)
            if bm25 is not None:
                bm25[b, : len(d)] = torch.tensor(s, dtype=torch.float32)
            passages += d
            pair_prefix += [b] * len(d)
        enc = self.fmt.encode(self.tokenizer, [r["prefix_text"] for r in rows], passages, pair_prefix,
                              padding=self.padding)
        nodoc = torch.tensor([float("nan") if r.get("nodoc_logprob") is None else float(r["nodoc_logprob"])
                              for r in rows], dtype=torch.float32)
        out = {**enc, "mask": mask, "lm_logprobs": lm, "nodoc_logprob": nodoc,
               "ids": torch.tensor([int(r["id"]) for r in rows], dtype=torch.long)}
        return out if bm25 is None else {**out, "bm25": bm25}


class _EpochBatches:
    """Batches of epoch ``e``: a permutation drawn from ``(seed, e)`` (never from the global RNG), this rank's
    share of it, cut into full batches; the first ``skip`` batches are left out (a resumed epoch)."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world: int = 1):
        self.n, self.batch_size, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.epoch, self.skip = 0, 0

    def _batches(self) -> list[list[int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)[self.rank::self.world]
        return [order[i:i + self.batch_size].tolist() for i in range(0, len(order) - self.batch_size + 1,
                                                                     self.batch_size)]

    def __iter__(self):
        return iter(self._batches()[self.skip:])

    def __len__(self) -> int:
        """Batches of a whole epoch (Lightning counts a resumed epoch's batches from its restored progress)."""
        return len(range(self.rank, self.n, self.world)) // self.batch_size


class ResumableLoader(DataLoader):
    """The training loader: shuffled, sharded by rank, and able to resume mid-epoch exactly.

    Its state (epoch, batches handed out in it) is saved in every Lightning checkpoint
    (``state_dict``/``load_state_dict``), so a resumed run trains on exactly the batches an
    uninterrupted one would have, in the same order.
    """

    def __init__(self, dataset, batch_size: int, seed: int, collate_fn, num_workers: int = 0, rank: int = 0,
                 world: int = 1):
        self._batches = _EpochBatches(len(dataset), batch_size, seed, rank, world)
        super().__init__(dataset, batch_sampler=self._batches, collate_fn=collate_fn, num_workers=num_workers,
                         persistent_workers=False, generator=torch.Generator().manual_seed(seed))
        self._epoch, self._taken = 0, 0

    def __iter__(self):
        # An epoch whose batches were all handed out is over even if its iterator was never run to the
        # end (Lightning stops pulling once it has the epoch's known length, e.g. after a resume).
        if self._taken >= len(self._batches):
            self._epoch, self._taken = self._epoch + 1, 0
        self._batches.epoch, self._batches.skip = self._epoch, self._taken
        for batch in super().__iter__():
            self._taken += 1
            yield batch

    def __len__(self) -> int:
        return len(self._batches)

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "taken": self._taken}

    def load_state_dict(self, state: dict) -> None:
        self._epoch, self._taken = int(state["epoch"]), int(state["taken"])


class RerankDataModule(pl.LightningDataModule):
    """Parquet shards → train / validation loaders of (example, candidates) batches.

    What the collator feeds the encoder (tokenizer, :class:`~reranking.inputs.InputFormat`) is the model's:
    under ``reranking.fit`` it is taken from the LightningModule being trained, so it has one source (the
    ``--model.*`` settings); used on its own, :meth:`reading` sets it.

    Args:
        data_dir: directory with ``*.parquet`` shards (and ``manifest.json``) written by ``data_gen``.
        val_fraction: share of examples held out for validation, chosen by hashing the example id.
        split_seed: seed of that hash; the split does not depend on row order or sharding.
        batch_size: examples per (micro-)batch, each with its up-to-k candidates.
        max_candidates: keep at most this many candidates per example (BM25 order); ``None`` = all.
        num_workers: DataLoader worker processes (tokenization runs there).
        val_batch_size: examples per validation batch (default: ``batch_size``).
        shuffle_seed: seed of the training order (epoch e's order depends only on it and e); ``None``
            (default): the run's ``--seed_everything`` (Lightning's ``PL_GLOBAL_SEED``; 0 if no seed was
            set), so that a training seed varies the data order as well as dropout masks and new weights.
        examples: read only the n examples of smallest id (data_gen's ids: the first n the sampler drew, a
            random sample of the set; the subsets of a learning curve nest); ``None``: all.
    """

    def __init__(self, data_dir: str, val_fraction: float = 0.02, split_seed: int = 0, batch_size: int = 32,
                 max_candidates: int | None = 16, num_workers: int = 2, val_batch_size: int | None = None,
                 shuffle_seed: int | None = None, examples: int | None = None):
        super().__init__()
        if examples is not None and examples < 1:
            raise SettingsError(f"--data.examples {examples} must be >= 1 or null (all)")
        if not 0.0 < val_fraction < 1.0:
            raise SettingsError(f"--data.val_fraction {val_fraction} must be in (0, 1), e.g. 0.02")
        if batch_size < 1:
            raise SettingsError(f"--data.batch_size {batch_size} must be >= 1")
        if max_candidates is not None and max_candidates < 1:
            raise SettingsError(f"--data.max_candidates {max_candidates} must be >= 1 or null")
        self.save_hyperparameters()
        self.fmt: InputFormat | None = None
        self.train_ds = self.val_ds = None
        self._tokenizer = None

    def reading(self, tokenizer, fmt: InputFormat) -> "RerankDataModule":
        """Outside ``reranking.fit``: batches for a reranker with this tokenizer (a name, a directory or a loaded
        tokenizer) and input format."""
        self._tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.fmt = fmt
        return self

    def _model_reads(self) -> None:
        if self.fmt is None:
            system = self.trainer.lightning_module if self.trainer is not None else None
            if system is None:
                raise RuntimeError("RerankDataModule: no model to read the format of; call .reading(tokenizer, fmt)")
            self.reading(system.tokenizer, system.fmt)

    @property
    def tokenizer(self):
        self._model_reads()
        return self._tokenizer

    def _load(self):
        files = parquet_files(self.hparams.data_dir)
        check_shards(files, "--data.data_dir")
        try:
            ds = load_dataset("parquet", data_files=files, split="train")
        except (OSError, ValueError, DatasetGenerationError) as e:
            bad = next((f for f in files if not _readable(f)), None)  # which one: its pages read one by one
            raise InputError(f"--data.data_dir {self.hparams.data_dir}: {bad or 'a shard'} cannot be read "
                             f"({str(e).splitlines()[0][:200]}); its bytes are damaged: regenerate it with "
                             "data_gen.build (or copy it again)") from None
        missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
        if missing:
            raise InputError(f"{self.hparams.data_dir}: shards lack columns {missing} (have {ds.column_names}); "
                             "they must come from data_gen's score stage")
        keep = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in ds.column_names]
        return ds.select_columns(keep)

    def prepare_data(self):
        self._load()  # builds the datasets cache once (rank 0) before every rank reads it in setup()
        self._model_reads()  # fetches the tokenizer files once

    def setup(self, stage: str | None = None):
        if self.train_ds is not None:
            return
        ds = self._load()
        ids = np.asarray(ds["id"])
        if self.hparams.examples is not None:
            if self.hparams.examples > len(ids):
                raise SettingsError(f"--data.examples {self.hparams.examples:,} exceeds the {len(ids):,} examples of "
                                    f"{self.hparams.data_dir}; lower it, or null for all")
            keep = ids <= np.partition(ids, self.hparams.examples - 1)[self.hparams.examples - 1]
            ds, ids = ds.select(np.flatnonzero(keep)), ids[keep]
        val = is_validation(ids, self.hparams.val_fraction, self.hparams.split_seed,
                            targets_per_window(self.hparams.data_dir))
        if val.all() or not val.any():
            raise SettingsError(f"val_fraction={self.hparams.val_fraction} of {len(ds)} examples leaves an empty "
                             "train or validation split; change --data.val_fraction")
        self.train_ds = ds.select(np.flatnonzero(~val))
        self.val_ds = ds.select(np.flatnonzero(val))

    def collator(self, padding: str = "longest") -> RerankCollator:
        self._model_reads()
        return RerankCollator(self._tokenizer, self.fmt, self.hparams.max_candidates, padding=padding)

    def shuffle_seed(self) -> int:
        """The training order's seed: ``--data.shuffle_seed``, else the seed ``seed_everything`` set (which
        ``reranking.fit`` always calls, and calls again with the same seed when a run resumes)."""
        if self.hparams.shuffle_seed is not None:
            return int(self.hparams.shuffle_seed)
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    def train_dataloader(self):
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if len(self.train_ds) < self.hparams.batch_size * world:
            raise ValueError(f"{len(self.train_ds)} training examples cannot fill one batch of {self.hparams.batch_size} "
                             f"on each of {world} device(s); lower --data.batch_size or generate more data")
        return ResumableLoader(self.train_ds, self.hparams.batch_size, self.shuffle_seed(), self.collator(),
                               num_workers=self.hparams.num_workers, rank=rank, world=world)

    def val_dataloader(self):
        sampler = None
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:
            # Each example exactly once across ranks (the default sampler repeats some to even out the
            # ranks, which would double-count them in the summed metrics).
            sampler = UnrepeatedDistributedSampler(self.val_ds, num_replicas=trainer.world_size,
                                                   rank=trainer.global_rank, shuffle=False)
        return DataLoader(self.val_ds, batch_size=self.hparams.val_batch_size or self.hparams.batch_size,
                          shuffle=False, sampler=sampler, collate_fn=self.collator(),
                          num_workers=self.hparams.num_workers, persistent_workers=self.hparams.num_workers > 0)
