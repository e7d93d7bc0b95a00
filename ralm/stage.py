"""The frozen-LM prediction stage that ``eval.ppl`` and ``data_gen.build`` share.

Both open the LM the same way (one device, or spread by ``--scoring.device_map``), run one Lightning
``Trainer.predict`` whose writer puts every batch's result on disk as it comes, and wait at a barrier
so that rank 0 finds every rank's files. Keeping the Trainer's flags here keeps the two stages from
drifting apart (they did: two copies of the same eleven lines).
"""

from __future__ import annotations

import time
from pathlib import Path

from ralm.settings import Devices, Scoring


def open_lm(model: str, scoring: Scoring, work: Path):
    """The frozen causal LM, loaded on CPU for Lightning to move, or placed by ``scoring.device_map``
    (weights that do not fit offloaded under ``work/offload``)."""
    from ralm.models import load_causal_lm

    lm, _ = load_causal_lm(model, "cpu", device_map=scoring.device_map, max_memory=scoring.max_memory,
                           offload_folder=str(Path(work) / "offload"))
    return lm


def predict(module, data, writer, devices: Devices, scoring: Scoring, name: str):
    """``Trainer.predict(module, data)`` with ``writer`` as its only callback, then a barrier named
    ``NAME.done``. Only global rank 0 keeps the writer's progress bar.

    Returns ``(is_global_zero, seconds, world_size)``."""
    import lightning.pytorch as pl

    trainer = pl.Trainer(**devices.kwargs(one_process=scoring.device_map is not None), logger=False,
                         enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                         callbacks=[writer], inference_mode=True)
    if not trainer.is_global_zero:
        writer.progress = None
    t0 = time.perf_counter()
    trainer.predict(module, dataloaders=data, return_predictions=False)
    trainer.strategy.barrier(f"{name}.done")  # every rank's files are on disk
    return trainer.is_global_zero, time.perf_counter() - t0, trainer.world_size
