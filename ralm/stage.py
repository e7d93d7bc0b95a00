"""The frozen-LM prediction stage that ``eval.ppl`` and ``data_gen.build`` share.

Evaluation and retrieval read their text the same way (:func:`tokenize_text`). Both scoring stages
open the LM the same way (one device, or spread by ``--scoring.device_map``), run one Lightning
``Trainer.predict`` whose writer puts every batch's result on disk as it comes, and wait at a barrier
so that rank 0 finds every rank's files. Keeping the Trainer's flags here keeps the two stages from
drifting apart (they did: two copies of the same eleven lines).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl

from ralm.loading import check_causal_lm, load_causal_lm, load_config, load_tokenizer
from ralm.scoring import context_length
from ralm.settings import Devices, InputError, Scoring, Text, Windows
from ralm.sigterm import StopOnSigterm
from ralm.windows import stride_windows


@dataclass(frozen=True)
class Tokens:
    """A text as the LM reads it: its tokens and their strided windows (``ralm.windows``)."""

    body: str
    tokenizer: object
    ids: list
    wins: list
    max_length: int


def tokenize_text(model: str, text: Text, windows: Windows, *, documents: bool = True) -> Tokens:
    """Load the text and the LM's tokenizer, fit the window to the LM's context (leaving room for a
    document when ``documents``), cut the strides. Refuses a model that is not a causal LM and a text
    of fewer than 2 tokens, naming the flag."""
    try:
        body = text.load()
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"--text: {e}") from None
    tokenizer, config = load_tokenizer(model), load_config(model)
    check_causal_lm(model, config, tokenizer)
    max_length = windows.fitted(context_length(config), documents=documents)
    ids = tokenizer(body, add_special_tokens=False)["input_ids"]
    if len(ids) < 2:
        raise InputError(f"--text ({text.describe()}) has {len(ids)} token(s); perplexity needs at least 2")
    return Tokens(body, tokenizer, ids, stride_windows(len(ids), windows.stride, max_length), max_length)


def open_lm(model: str, scoring: Scoring, work: Path):
    """The frozen causal LM, loaded on CPU for Lightning to move, or placed by ``scoring.device_map``
    (weights that do not fit offloaded under ``work/offload``)."""
    lm, _ = load_causal_lm(model, "cpu", device_map=scoring.device_map, max_memory=scoring.max_memory,
                           offload_folder=str(Path(work) / "offload"))
    return lm


def predict(module, data, writer, devices: Devices, scoring: Scoring, name: str):
    """``Trainer.predict(module, data)`` with ``writer`` as its only callback, then a barrier named
    ``NAME.done``. Only global rank 0 keeps the writer's progress bar.

    Returns ``(is_global_zero, seconds, world_size)``."""
    stop = StopOnSigterm(name)
    trainer = pl.Trainer(**devices.kwargs(one_process=scoring.device_map is not None), logger=False,
                         enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                         callbacks=[writer, stop], inference_mode=True)
    if not trainer.is_global_zero:
        writer.progress = None
    t0 = time.perf_counter()
    with stop.catching_ctrl_c():
        trainer.predict(module, dataloaders=data, return_predictions=False)
    trainer.strategy.barrier(f"{name}.done")  # every rank's files are on disk
    return trainer.is_global_zero, time.perf_counter() - t0, trainer.world_size
