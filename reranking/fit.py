"""``python -m reranking.fit --config configs/fit.yaml``: train the predictive reranker.

A ``LightningCLI(run=False)`` over :class:`~reranking.system.RerankerSystem` (``model:``) and
:class:`~reranking.data.RerankDataModule` (``data:``) plus ``trainer:``; ``--print_config`` prints the
resolved config, and each run saves it next to its logs. Defaults: 10,000 steps, seed 0, TensorBoard
logs under ``checkpoints/reranker/version_N/``, a ``ModelCheckpoint`` there keeping the best
chosen-passage NLL (``val/nll_reranker``) and ``last.ckpt``.

Resuming is exact: ``--ckpt_path .../version_N/checkpoints/last.ckpt`` continues in that same run
directory (its logs, its best-checkpoint record), with the data order and random state the
uninterrupted run would have had, so it exports the same weights. A run with a fixed
``--trainer.logger.init_args.version`` resumes by itself when rerun, and so does one with the default version
(a new ``version_N`` a run) when its newest run had the same settings and stopped early. A SIGTERM (``kill``, a scheduler's
time limit) or Ctrl-C saves ``last.ckpt`` at the step the fit is on and exits 143 / 130. At the end the
best checkpoint (or the final weights if there is none) is exported to ``<run dir>/reranker/`` (see
:mod:`reranking.export`), loadable with ``reranking.load``; ``--trainer.max_steps 0`` exports the
untrained start, recorded as such.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import sys
from importlib.metadata import version
from pathlib import Path

from ralm.cli import work_done
from ralm.files import atomic_write

PROG = "python -m reranking.fit"


def _help_cache_file() -> Path:
    """Where ``--help``'s text is kept: keyed by this package's source and the versions of the libraries
    that shape the parser, so any change makes a new one."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")) + [Path(__file__).parents[1] / "ralm" / "settings.py"]:
        h.update(f.read_bytes())
    for pkg in ("lightning", "jsonargparse", "transformers", "torch"):
        h.update(version(pkg).encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ralm-rerank" / "help"
    return root / f"reranking.fit-{h.hexdigest()[:16]}.txt"


def _help(args: list[str]) -> int:
    """``--help`` alone: LightningCLI must import lightning to build its parser (seconds on a small
    machine), so the text is printed from a cache made by the first call."""
    cache = _help_cache_file()
    if cache.is_file():
        sys.stdout.write(cache.read_text())
        return 0
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            _fit(args)
        except SystemExit:
            pass
    text = buf.getvalue()
    sys.stdout.write(text)
    if text.startswith("usage:"):
        try:
            atomic_write(cache, lambda t: Path(t).write_text(text))
        except (OSError, ValueError):
            pass  # an unwritable cache only costs the next --help its seconds
    return 0


def _fit(args: list[str]):
    from reranking.training import fit  # Lightning: seconds of imports that --help does without

    return fit(args, description=__doc__)


def main(args: list[str] | None = None):
    """Run training (``args`` as on the command line; ``None`` = ``sys.argv[1:]``); returns the CLI, or an
    exit status (2 after a one-line error, 143 / 130 after SIGTERM / SIGINT)."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv in (["--help"], ["-h"]):
        return _help(argv)
    try:
        return _fit(argv)
    finally:
        work_done(PROG)


if __name__ == "__main__":
    out = main()
    sys.exit(out if isinstance(out, int) else 0)
