"""Callbacks of reranker runs: checkpoints that describe themselves and resume exactly, and progress that a
log file shows."""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ralm.progress import Progress
from reranking.export import CKPT_META_KEY, checkpoint_meta


class RerankerCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is always the latest state.

    Lightning 2.6 refreshes ``last.ckpt`` after a validation only when a top-k checkpoint was also
    written at that step, so a run whose metric stopped improving would resume from an old step.
    This also writes ``last.ckpt`` after every validation and at the end of training.
    """

    def __init__(self, *args, enable_version_counter: bool = False, **kwargs):
        # A resumed run writes into its own directory: last.ckpt is replaced, never joined by last-v1.ckpt.
        super().__init__(*args, enable_version_counter=enable_version_counter, **kwargs)
        self.validations: dict[int, dict[str, float]] = {}  # step -> that validation's metrics (the export's card)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "validations": {str(k): v for k, v in self.validations.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.validations = {int(k): dict(v) for k, v in (state_dict.get("validations") or {}).items()}

    def _refresh_last(self, trainer) -> None:
        if (self.save_last and not self._should_skip_saving_checkpoint(trainer)):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.validations[trainer.global_step] = {k: round(float(v), 6) for k, v in trainer.callback_metrics.items()
                                                     if k.startswith("val/")}
        super().on_validation_end(trainer, pl_module)
        self._refresh_last(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        self._refresh_last(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """A fit stopped by SIGTERM (a scheduler's time limit, ``kill``) or Ctrl-C keeps ``last.ckpt`` at the
        step it was on, so that the same command continues from there."""
        if isinstance(exception, (SIGTERMException, KeyboardInterrupt)) and trainer.state.fn == "fit":
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class RerankerState(Callback):
    """Every checkpoint carries the reranker's self-description (:func:`reranking.export.checkpoint_meta`:
    ``eval.ppl --reranker X.ckpt`` needs nothing else) and the random state, so that a resumed run draws the
    dropout masks the uninterrupted one would have. (numpy's key array is stored as a tensor: checkpoints stay
    loadable with ``torch.load(weights_only=True)``.)"""

    def __init__(self):
        self._meta = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self._meta is None:  # the tokenizer's files and the config do not change during a run
            self._meta = checkpoint_meta(pl_module)
        checkpoint[CKPT_META_KEY] = self._meta
        states = _collect_rng_states(include_cuda=torch.cuda.is_available())
        name, keys, pos, has_gauss, gauss = states["numpy"]
        states["numpy"] = (name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss)
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:
            states = dict(checkpoint["rng_states"])
            name, keys, pos, has_gauss, gauss = states["numpy"]
            states["numpy"] = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss)
            _set_rng_states(states)


class LogProgress(Callback):
    """Training progress that a log file shows, and TensorBoard events on disk at least every ``interval`` s.

    Lightning's bar is a carriage-return line that a file never shows; when stderr is not a terminal this
    prints ``[fit] step 40/100 (40.0%) 0.13 steps/s, elapsed 5m07s, ETA 7m41s, loss 1.234`` every
    ``interval`` seconds instead, and after every validation the validation metrics.
    """

    def __init__(self, interval: float = 30.0):
        self.interval = interval
        self.progress = None
        self.tty = sys.stderr.isatty()

    def on_train_start(self, trainer, pl_module) -> None:
        self.progress = Progress(max(trainer.max_steps, 1), "fit", "steps", enabled=not self.tty and
                                 trainer.is_global_zero, interval=self.interval, initial=trainer.global_step)
        self.progress._bar = None  # lines only: on a terminal Lightning's own bar is shown
        self._flushed = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.progress is None:
            return
        step = trainer.global_step
        if step > self.progress.n:
            if self.progress.enabled and time.monotonic() - self.progress._last >= self.interval:
                loss = trainer.callback_metrics.get("train/loss")  # read only when printed (a device sync)
                self.progress.extra = f", loss {float(loss):.4f}" if loss is not None else ""
            self.progress.update(step - self.progress.n)
        if time.monotonic() - self._flushed >= self.interval:
            self._flushed = time.monotonic()
            experiment = getattr(trainer.logger, "experiment", None)
            if hasattr(experiment, "flush"):
                experiment.flush()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.progress is None or trainer.sanity_checking or not self.progress.enabled:
            return
        shown = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if shown:
            print(f"[fit] step {trainer.global_step} validation: "
                  + ", ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items())), file=sys.stderr, flush=True)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.progress is not None:
            self.progress.close()
