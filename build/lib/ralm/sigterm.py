"""A Lightning prediction run that stops on SIGTERM, as ``kill PID`` and schedulers' time limits expect."""

from __future__ import annotations

import sys

import lightning.pytorch as pl


class StopOnSigterm(pl.Callback):
    """Ends a prediction run at the batch after a SIGTERM (exit status 143).

    Lightning's prediction loop only notes the signal ("Bypassing SIGTERM") and runs on to the end, so a
    scoring job (``data_gen.build``, ``eval.ppl``) ignored ``kill`` for as long as it had work. The writer
    (the callback before this one) has put the batch on disk; the same command continues from there."""

    def __init__(self, name: str):
        self.name = name

    def on_predict_batch_end(self, trainer, *args, **kwargs) -> None:
        if trainer.received_sigterm:
            print(f"[{self.name}] stopped by SIGTERM; what is on disk is kept: rerun the same command to continue",
                  file=sys.stderr, flush=True)
            raise SystemExit(128 + 15)
