"""A Lightning prediction run that stops on SIGTERM or Ctrl-C at the next batch, as ``kill PID``, schedulers'
time limits and a user at the terminal expect."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import lightning.pytorch as pl

from ralm import stop_on_sigterm


class CtrlC:
    """Whether a Ctrl-C came (:func:`ctrl_c_as_sigterm`)."""

    pressed = False


@contextlib.contextmanager
def ctrl_c_as_sigterm():
    """During a Lightning fit, the first Ctrl-C (SIGINT) is a SIGTERM to this process: Lightning stops the fit
    at its next batch boundary as it does for a scheduler's kill, keeping ``last.ckpt`` at a step the same
    command resumes exactly (a KeyboardInterrupt could land inside a validation, whose partial result the
    resumed run then took for a whole one). Before Lightning handles SIGTERM, and at a second Ctrl-C, it
    interrupts at once. Main thread only; yields a :class:`CtrlC`."""
    seen = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def on_sigint(signum, frame):
        if seen.pressed or signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None, stop_on_sigterm):
            raise KeyboardInterrupt
        seen.pressed = True
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


class StopOnSigterm(pl.Callback):
    """Ends a prediction run at the batch after a SIGTERM (exit status 143) or a Ctrl-C (SIGINT: 130).

    Lightning's prediction loop only notes a SIGTERM ("Bypassing SIGTERM") and runs on to the end, so a scoring job
    (``data_gen.build``, ``eval.ppl``) ignored ``kill`` for as long as it had work; a Ctrl-C raised inside a batch,
    and Lightning turned it into exit status 1 with no word. Here both end the run once the batch is on disk (the
    writer is the callback before this one), with one line; the same command continues from there. A second
    Ctrl-C interrupts at once."""

    def __init__(self, name: str):
        self.name = name
        self.interrupted = False

    @contextlib.contextmanager
    def catching_ctrl_c(self):
        """During the run, the first SIGINT only marks the run as interrupted (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_sigint(signum, frame):
            if self.interrupted:
                raise KeyboardInterrupt
            self.interrupted = True

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def on_predict_batch_end(self, trainer, *args, **kwargs) -> None:
        if trainer.received_sigterm or self.interrupted:
            why, status = ("SIGTERM", 128 + 15) if trainer.received_sigterm else ("Ctrl-C (SIGINT)", 130)
            print(f"[{self.name}] stopped by {why}; what is on disk is kept: rerun the same command to continue",
                  file=sys.stderr, flush=True)
            raise SystemExit(status)
