"""``python -m reranking.fit --config configs/fit.yaml``: train the predictive reranker.

A ``LightningCLI(run=False)`` over :class:`~reranking.system.RerankerSystem` (``model:``) and
:class:`~reranking.data.RerankDataModule` (``data:``) plus ``trainer:``; ``--print_config`` prints the
resolved config, and each run saves it next to its logs. Defaults: 10,000 steps, seed 0, TensorBoard
logs under ``checkpoints/reranker/version_N/``, a ``ModelCheckpoint`` there keeping the best
chosen-passage NLL (``val/nll_reranker``) and ``last.ckpt``.

Resuming is exact: ``--ckpt_path .../version_N/checkpoints/last.ckpt`` continues in that same run
directory (its logs, its best-checkpoint record), with the data order and random state the
uninterrupted run would have had, so it exports the same weights. A run with a fixed
``--trainer.logger.init_args.version`` resumes by itself when rerun. At the end the best checkpoint
(or the final weights if there is none) is exported to ``<run dir>/reranker/`` (see
:mod:`reranking.export`), loadable with ``reranking.export.load_reranker``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jsonargparse import ArgumentError

from ralm.cli import USER_ERRORS, error, help_formatter, quiet_libraries

PROG = "python -m reranking.fit"


def _trainer_class():
    import lightning.pytorch as pl

    class Trainer(pl.Trainer):
        """Lightning's Trainer whose ``precision`` defaults to ``auto``: bf16-mixed where the accelerator runs
        bf16 natively, 32-true elsewhere (:mod:`ralm.precision`); any Lightning precision still wins."""

        def __init__(self, *args, precision: str | int | None = "auto", **kwargs):
            from ralm.precision import lightning_precision

            check_precision(precision)
            precision, line = lightning_precision(precision, kwargs.get("accelerator"))
            if line:
                print(f"[reranking.fit] {line}", file=sys.stderr, flush=True)
            from reranking.callbacks import LogProgress

            callbacks = list(kwargs.pop("callbacks", None) or [])
            if not any(isinstance(c, LogProgress) for c in callbacks):
                callbacks.append(LogProgress())
            if not sys.stderr.isatty():  # a carriage-return bar is noise in a log file; LogProgress prints lines
                kwargs["enable_progress_bar"] = False
            super().__init__(*args, precision=precision, callbacks=callbacks, **kwargs)

    return Trainer


def check_precision(precision) -> None:
    """``auto`` or one of Lightning's precision spellings (refused with the list before anything is built)."""
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT

    from ralm.settings import SettingsError

    allowed = ["auto"] + [v for lit in typing.get_args(_PRECISION_INPUT) for v in typing.get_args(lit)]
    if precision is not None and precision not in allowed and str(precision) not in map(str, allowed):
        raise SettingsError(f"--trainer.precision {precision!r} is not a precision: use auto (bf16-mixed where the "
                            "hardware runs bf16 natively, 32-true elsewhere) or one of "
                            f"{', '.join(map(str, allowed[1:]))}")


def _cli_class():
    from lightning.pytorch.cli import LightningCLI

    from reranking.system import MONITOR

    class RerankerCLI(LightningCLI):
        def __init__(self, *args, trainer_class=None, **kwargs):
            super().__init__(*args, trainer_class=trainer_class or _trainer_class(), **kwargs)

        def add_arguments_to_parser(self, parser):
            parser.add_argument("--ckpt_path", type=str | None, default=None,
                                help="Resume from this checkpoint of a reranking.fit run (e.g. .../last.ckpt), in "
                                     "the same run directory.")
            parser.add_argument("--export_dir", type=str | None, default=None,
                                help="Where to export the final reranker (default: <run dir>/reranker).")
            # One source of truth for the tokenizer and the input format: the model's settings.
            parser.link_arguments("model.encoder", "data.tokenizer")
            parser.link_arguments("model.max_length", "data.max_length")
            parser.link_arguments("model.max_prefix_tokens", "data.max_prefix_tokens")
            parser.link_arguments("model.architecture", "data.architecture")
            parser.link_arguments("model.max_passage_tokens", "data.max_passage_tokens")
            parser.link_arguments("model.drop", "data.drop")
            parser.set_defaults({
                "trainer.max_steps": 10_000,
                "trainer.use_distributed_sampler": False,  # the loaders shard by rank themselves (exact resume)
                "trainer.logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                                   "init_args": {"save_dir": "checkpoints", "name": "reranker",
                                                 "default_hp_metric": False}},
                "trainer.callbacks": [
                    {"class_path": "reranking.callbacks.RerankerCheckpoint",
                     "init_args": {"monitor": MONITOR, "mode": "min", "save_last": True,
                                   "filename": "best-step{step:06d}", "auto_insert_metric_name": False}},
                ],
            })

        def before_instantiate_classes(self) -> None:
            check_precision(self.config.trainer.get("precision"))
            check_schedule(self.config)
            resume_in_place(self.config)

    return RerankerCLI


def check_schedule(cfg) -> None:
    """The schedule must be finite and longer than its warm-up (checked before anything is built)."""
    from ralm.settings import SettingsError

    steps = cfg.trainer.get("max_steps", -1)
    total = cfg.model.get("total_steps") or steps
    warm = cfg.model.get("warmup_steps", 0)
    if total is None or total < 0:
        raise SettingsError("the learning-rate schedule needs a length: set --trainer.max_steps (or --model.total_steps)")
    if total <= warm:
        raise SettingsError(f"the schedule ({total} steps, --trainer.max_steps / --model.total_steps) must be longer than "
                            f"its warm-up (--model.warmup_steps {warm}); lower --model.warmup_steps or raise "
                            "--trainer.max_steps")


def _logger_args(cfg) -> dict | None:
    lg = cfg.trainer.get("logger")
    if lg is None or isinstance(lg, bool) or "TensorBoardLogger" not in str(lg.get("class_path", "")):
        return None
    return lg["init_args"]


def resume_in_place(cfg) -> None:
    """Continue a run in its own directory: from ``--ckpt_path`` (its run directory becomes the logger's),
    or, for a logger with a fixed version, from that directory's ``last.ckpt`` when it exists."""
    from ralm.settings import InputError

    args = _logger_args(cfg)
    if args is not None:  # absolute, so that a resumed run's checkpoint directory compares equal to the first's
        args["save_dir"] = str(Path(args.get("save_dir") or ".").resolve())
    if cfg.ckpt_path:
        ckpt = Path(cfg.ckpt_path)
        check_checkpoint(ckpt)
        if args is not None and ckpt.parent.name == "checkpoints" and len(ckpt.parents) >= 4:
            run_dir = ckpt.resolve().parent.parent  # <save_dir>/<name>/<version>/checkpoints/last.ckpt
            args["save_dir"], args["name"], args["version"] = str(run_dir.parent.parent), run_dir.parent.name, run_dir.name
    elif args is not None and args.get("version") is not None:
        last = Path(args["save_dir"]) / (args.get("name") or "") / str(args["version"]) / "checkpoints" / "last.ckpt"
        if last.is_file():
            check_checkpoint(last)
            cfg.ckpt_path = str(last)
            print(f"[reranking.fit] resuming from {last}", file=sys.stderr)
    if cfg.ckpt_path and not Path(cfg.ckpt_path).is_file():
        raise InputError(f"--ckpt_path {cfg.ckpt_path!r} does not exist")


def check_checkpoint(path: Path) -> None:
    """A checkpoint to resume from must be a readable one of reranking.fit (read without unpickling code)."""
    from ralm.settings import InputError
    from reranking.export import read_checkpoint

    if not path.is_file():
        raise InputError(f"--ckpt_path {str(path)!r} does not exist")
    read_checkpoint(path, "--ckpt_path")


def best_or_last_weights(trainer, system) -> int:
    """Load the best checkpoint's weights into ``system`` (if ModelCheckpoint kept one); returns the step
    the weights are from, which the export records (the best step, not the fit's last)."""
    import torch

    ckpt = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
    if ckpt and Path(ckpt).is_file():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        system.load_state_dict(state["state_dict"], strict=True)
        return int(state["global_step"])
    return trainer.global_step


def _help_cache_file() -> Path:
    """Where ``--help``'s text is kept: keyed by this package's source and the versions of the libraries
    that shape the parser, so any change makes a new one."""
    import hashlib
    from importlib.metadata import version

    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    for pkg in ("lightning", "jsonargparse", "transformers", "torch"):
        h.update(version(pkg).encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ralm-rerank" / "help"
    return root / f"reranking.fit-{h.hexdigest()[:16]}.txt"


def _help(args: list[str]) -> int:
    """``--help`` alone: LightningCLI must import lightning to build its parser (seconds on a small
    machine), so the text is printed from a cache made by the first call."""
    import contextlib
    import io

    cache = _help_cache_file()
    if cache.is_file():
        sys.stdout.write(cache.read_text())
        return 0
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            _run(args)
        except SystemExit:
            pass
    text = buf.getvalue()
    sys.stdout.write(text)
    if text.startswith("usage:"):
        try:
            from ralm.files import atomic_write

            atomic_write(cache, lambda t: Path(t).write_text(text))
        except (OSError, ValueError):
            pass  # an unwritable cache only costs the next --help its seconds
    return 0


def main(args: list[str] | None = None):
    """Run training (``args`` as on the command line; ``None`` = ``sys.argv[1:]``); returns the CLI, or the
    exit status 2 after a one-line error."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv in (["--help"], ["-h"]):
        return _help(argv)
    return _run(argv)


def _run(args: list[str]):
    import warnings

    verbose = "--verbose" in args
    if verbose:
        args = [a for a in args if a != "--verbose"]
    quiet_libraries(verbose)
    # main() always hands LightningCLI the parsed-out argv, which its args/sys.argv check warns about
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    try:
        from contextlib import nullcontext

        from ralm.cli import quiet_lightning
        from ralm.outputs import claim
        from reranking.data import RerankDataModule
        from reranking.export import export
        from reranking.system import RerankerSystem

        cli_class = _cli_class()
        quiet_lightning(verbose)
        cli = cli_class(RerankerSystem, RerankDataModule, run=False, args=args, seed_everything_default=0,
                        save_config_kwargs={"overwrite": True}, subclass_mode_model=False,
                        auto_configure_optimizers=False,
                        parser_kwargs={"prog": PROG, "exit_on_error": False, "description": __doc__,
                                       "formatter_class": help_formatter()})
        trainer, system = cli.trainer, cli.model
        # a second fit exporting to the same --export_dir is refused before it trains (a default export
        # goes to this run's own version directory)
        with claim(cli.config.export_dir, "--export_dir") if cli.config.export_dir else nullcontext():
            trainer.fit(system, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
            step = best_or_last_weights(trainer, system)
            log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
            if trainer.is_global_zero:
                out = cli.config.export_dir or str(Path(log_dir or "checkpoints") / "reranker")
                export(system, out, trained={"precision": str(trainer.precision), "steps": step,
                                                 "fit_steps": trainer.global_step})
                print(f"exported reranker to {out}", file=sys.stderr)
    except USER_ERRORS as e:
        return error(PROG, e)
    except ArgumentError as e:
        return error(PROG, f"{e} (see {PROG} --help)")
    return cli


if __name__ == "__main__":
    out = main()
    sys.exit(out if isinstance(out, int) else 0)
