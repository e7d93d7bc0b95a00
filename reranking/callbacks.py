"""Checkpointing for reranker runs."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint


class RerankerCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is always the latest state.

    Lightning 2.6 refreshes ``last.ckpt`` after a validation only when a top-k checkpoint was also
    written at that step, so a run whose metric stopped improving would resume from an old step.
    This also writes ``last.ckpt`` after every validation and at the end of training.
    """

    def __init__(self, *args, enable_version_counter: bool = False, **kwargs):
        # A resumed run writes into its own directory: last.ckpt is replaced, never joined by last-v1.ckpt.
        super().__init__(*args, enable_version_counter=enable_version_counter, **kwargs)

    def _refresh_last(self, trainer) -> None:
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer, pl_module) -> None:
        super().on_validation_end(trainer, pl_module)
        self._refresh_last(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        self._refresh_last(trainer)
