"""A reranker fit as ``python -m reranking.fit`` runs it: the LightningCLI, its Trainer, resume and stop.

* :class:`RerankerCLI` (``LightningCLI(run=False)``) over :class:`~reranking.system.RerankerSystem` and
  :class:`~reranking.data.RerankDataModule`; the data module reads what the model reads, so no setting is
  given twice.
* :class:`Trainer`: Lightning's, with ``precision: auto`` (:mod:`ralm.precision`), progress lines in a log
  file, self-describing checkpoints (:class:`~reranking.callbacks.RerankerState`) written to a temporary
  name and renamed (:class:`AtomicCheckpointIO`).
* :func:`fit`: resume in place, train, stop cleanly on SIGTERM / SIGINT (``last.ckpt`` at the step it was on,
  exit 143 / 130: the same command continues), export.
"""

from __future__ import annotations

import json
import sys
import typing
import warnings
from contextlib import nullcontext
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from jsonargparse import ArgumentError
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ralm.cli import USER_ERRORS, error, help_formatter, quiet_libraries, quiet_lightning
from ralm.files import atomic_write
from ralm.lock import claim
from ralm.precision import lightning_precision
from ralm.settings import InputError, SettingsError
from ralm.sigterm import ctrl_c_as_sigterm
from reranking.callbacks import LogProgress, RerankerState
from reranking.data import RerankDataModule
from reranking.export import CKPT_META_KEY, check_export_dir, export, read_checkpoint, run_id
from reranking.system import MONITOR, RerankerSystem

PROG = "python -m reranking.fit"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary name in their own folder, fsynced and renamed: a full disk or a kill
    never leaves a truncated ``best-*.ckpt`` or ``last.ckpt`` under its final name."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        atomic_write(path, lambda tmp: torch.save(checkpoint, tmp))


class Trainer(pl.Trainer):
    """Lightning's Trainer whose ``precision`` defaults to ``auto``: bf16-mixed where the accelerator runs
    bf16 natively, 32-true elsewhere (:mod:`ralm.precision`); any Lightning precision still wins."""

    def __init__(self, *args, precision: str | int | None = "auto", **kwargs):
        check_precision(precision)
        precision, line = lightning_precision(precision, kwargs.get("accelerator"))
        if line:
            print(f"[reranking.fit] {line}", file=sys.stderr, flush=True)
        callbacks = list(kwargs.pop("callbacks", None) or [])
        for kind in (LogProgress, RerankerState):
            if not any(isinstance(c, kind) for c in callbacks):
                callbacks.append(kind())
        if not sys.stderr.isatty():  # a carriage-return bar is noise in a log file; LogProgress prints lines
            kwargs["enable_progress_bar"] = False
        plugins = kwargs.pop("plugins", None) or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(hasattr(p, "save_checkpoint") for p in plugins):
            plugins.append(AtomicCheckpointIO())
        super().__init__(*args, precision=precision, callbacks=callbacks, plugins=plugins, **kwargs)


def check_precision(precision) -> None:
    """``auto`` or one of Lightning's precision spellings (refused with the list before anything is built)."""
    allowed = ["auto"] + [v for lit in typing.get_args(_PRECISION_INPUT) for v in typing.get_args(lit)]
    if precision is not None and precision not in allowed and str(precision) not in map(str, allowed):
        raise SettingsError(f"--trainer.precision {precision!r} is not a precision: use auto (bf16-mixed where the "
                            "hardware runs bf16 natively, 32-true elsewhere) or one of "
                            f"{', '.join(map(str, allowed[1:]))}")


class RerankerCLI(LightningCLI):
    def __init__(self, *args, trainer_class=None, **kwargs):
        super().__init__(*args, trainer_class=trainer_class or Trainer, **kwargs)

    def add_arguments_to_parser(self, parser):
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="Resume from this checkpoint of a reranking.fit run (e.g. .../last.ckpt), in "
                                 "the same run directory.")
        parser.add_argument("--export_dir", type=str | None, default=None,
                            help="Where to export the final reranker (default: <run dir>/reranker).")
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
        resume_in_place(self.config, lambda cfg: yaml.safe_load(self.parser.dump(cfg, skip_none=False)))


def check_schedule(cfg) -> None:
    """The schedule must be finite and longer than its warm-up (checked before anything is built); 0 steps
    (the untrained start, exported as such) needs none."""
    steps = cfg.trainer.get("max_steps", -1)
    optim = cfg.model.get("optimizer")
    total = (optim.get("total_steps") if optim else None) or steps
    warm = optim.get("warmup_steps", 0) if optim else 0
    if steps == 0:
        return
    if total is None or total < 0:
        raise SettingsError("the learning-rate schedule needs a length: set --trainer.max_steps (or "
                            "--model.optimizer.total_steps)")
    if total <= warm:
        raise SettingsError(f"the schedule ({total} steps, --trainer.max_steps / --model.optimizer.total_steps) must "
                            f"be longer than its warm-up (--model.optimizer.warmup_steps {warm}); lower "
                            "--model.optimizer.warmup_steps or raise --trainer.max_steps")
    every = cfg.trainer.get("val_check_interval")
    if isinstance(every, int) and not isinstance(every, bool) and steps > 0 and every > steps:
        print(f"[reranking.fit] note: --trainer.max_steps {steps} ends before the first validation "
              f"(--trainer.val_check_interval {every}): nothing is monitored and the export is the last step's "
              f"weights; set --trainer.val_check_interval to at most {steps} to validate", file=sys.stderr)


def _logger_args(cfg) -> dict | None:
    lg = cfg.trainer.get("logger")
    if lg is None or isinstance(lg, bool) or "TensorBoardLogger" not in str(lg.get("class_path", "")):
        return None
    return lg["init_args"]


def resume_in_place(cfg, as_dict=None) -> None:
    """Continue a run in its own directory: from ``--ckpt_path`` (its run directory becomes the logger's),
    or, for a logger with a fixed version, from that directory's ``last.ckpt`` when it exists; or, with the
    default version (a new ``version_N`` a run), from the newest one's when it is this very command's
    (``as_dict``: the settings as the run's ``config.yaml`` holds them) stopped before its last step."""
    args = _logger_args(cfg)
    if args is not None:  # absolute, so that a resumed run's checkpoint directory compares equal to the first's
        args["save_dir"] = str(Path(args.get("save_dir") or ".").resolve())
    if cfg.ckpt_path:
        ckpt = Path(cfg.ckpt_path)
        check_checkpoint(ckpt, cfg)
        if args is not None and ckpt.parent.name == "checkpoints" and len(ckpt.parents) >= 4:
            run_dir = ckpt.resolve().parent.parent  # <save_dir>/<name>/<version>/checkpoints/last.ckpt
            args["save_dir"], args["name"], args["version"] = str(run_dir.parent.parent), run_dir.parent.name, run_dir.name
    elif args is not None and args.get("version") is not None:
        last = run_directory(cfg) / "checkpoints" / "last.ckpt"
        if last.is_file():
            check_checkpoint(last, cfg)
            cfg.ckpt_path = str(last)
            print(f"[reranking.fit] resuming from {last}", file=sys.stderr)
    elif args is not None and as_dict is not None:
        stopped = _stopped_run(cfg, args, as_dict)
        if stopped is not None:
            args["version"] = stopped.parent.parent.name
            cfg.ckpt_path = str(stopped)
            print(f"[reranking.fit] resuming from {stopped}", file=sys.stderr)
    if cfg.ckpt_path and not Path(cfg.ckpt_path).is_file():
        raise InputError(f"--ckpt_path {cfg.ckpt_path!r} does not exist")


def _stopped_run(cfg, args: dict, as_dict) -> Path | None:
    """``last.ckpt`` of the newest ``version_N`` under the logger's directory when that run had these settings
    and stopped before ``max_steps`` (None: start a new version, as Lightning does)."""
    runs = [d for d in (Path(args["save_dir"]) / (args.get("name") or "")).glob("version_*")
            if d.name.removeprefix("version_").isdigit()]
    if not runs:
        return None
    newest = max(runs, key=lambda d: int(d.name.removeprefix("version_")))
    last, saved = newest / "checkpoints" / "last.ckpt", newest / "config.yaml"
    if not (last.is_file() and saved.is_file()):
        return None
    if _settings(yaml.safe_load(saved.read_text())) != _settings(as_dict(cfg)):
        return None
    steps = cfg.trainer.get("max_steps", -1)
    return last if steps < 0 or read_checkpoint(last, "--ckpt_path").get("global_step", 0) < steps else None


def _settings(d: dict) -> dict:
    """A run's settings without what a resume itself fills in (the checkpoint, the logger's version)."""
    d = dict(d or {})
    d.pop("ckpt_path", None)
    lg = ((d.get("trainer") or {}).get("logger") or {})
    if isinstance(lg, dict) and isinstance(lg.get("init_args"), dict):
        lg["init_args"] = {k: v for k, v in lg["init_args"].items() if k != "version"}
    return d


def run_directory(cfg) -> Path | None:
    """``<save_dir>/<name>/<version>`` of a TensorBoard logger with a fixed version (else None: Lightning
    picks a new ``version_N``)."""
    args = _logger_args(cfg)
    if args is None or args.get("version") is None:
        return None
    return Path(args["save_dir"]) / (args.get("name") or "") / str(args["version"])


def check_checkpoint(path: Path, cfg=None) -> None:
    """A checkpoint to resume from must be a readable one of reranking.fit (read without unpickling code), of
    the architecture this fit trains (``cfg``: the fit's settings)."""
    if not path.is_file():
        raise InputError(f"--ckpt_path {str(path)!r} does not exist")
    ckpt = read_checkpoint(path, "--ckpt_path")
    theirs = ckpt[CKPT_META_KEY].get("input_format", {}).get("architecture", "cross")
    ours = cfg.model.get("architecture") if cfg is not None else None
    if ours is not None and theirs != ours:
        raise InputError(f"--ckpt_path {str(path)!r} is a {theirs}-encoder's checkpoint and this fit trains a "
                         f"{ours}-encoder (--model.architecture {ours}); resume it with --model.architecture {theirs}, "
                         "or start this fit elsewhere (another --trainer.logger.init_args.version)")


def best_or_last_weights(trainer, system) -> int:
    """Load the best checkpoint's weights into ``system`` (if ModelCheckpoint kept one); returns the step
    the weights are from, which the export records (the best step, not the fit's last)."""
    ckpt = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
    if ckpt and Path(ckpt).is_file():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        system.load_state_dict(state["state_dict"], strict=True)
        return int(state["global_step"])
    return trainer.global_step


def data_identity(data_dir: str) -> str:
    """The training data as an export records it: its folder's name and, for a data_gen.build output, its
    content hash (no machine path: an export is shared)."""
    manifest = Path(data_dir) / "manifest.json"
    try:
        digest = json.loads(manifest.read_text())["content_hash"]
    except (OSError, ValueError, KeyError):
        return Path(data_dir).name
    return f"{Path(data_dir).name} (content hash {digest})"


def _stopped(trainer, signal_name: str, code: int, argv: list[str]) -> int:
    """One line on what a stopped fit kept and how it continues; the exit status."""
    last = getattr(trainer.checkpoint_callback, "last_model_path", "") if trainer.checkpoint_callback else ""
    kept = f"{last} (step {trainer.global_step})" if last and Path(last).is_file() else "nothing (no step finished)"
    print(f"[reranking.fit] stopped by {signal_name} at step {trainer.global_step}; kept {kept}; rerun the same "
          "command to continue" + ("" if "--ckpt_path" in argv or not last else f" (or add --ckpt_path {last})"),
          file=sys.stderr, flush=True)
    return code


def fit(args: list[str], description: str | None = None):
    """Train (``args`` as on the command line; ``description``: the ``--help`` text); returns the CLI, or an
    exit status: 2 after a one-line error, 143 / 130 after a SIGTERM / SIGINT (``last.ckpt`` kept)."""
    verbose = "--verbose" in args
    if verbose:
        args = [a for a in args if a != "--verbose"]
    quiet_libraries(verbose)
    # fit() always hands LightningCLI the parsed-out argv, which its args/sys.argv check warns about
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    try:
        quiet_lightning(verbose)
        cli = RerankerCLI(RerankerSystem, RerankDataModule, run=False, args=args, seed_everything_default=0,
                          save_config_kwargs={"overwrite": True}, subclass_mode_model=False,
                          auto_configure_optimizers=False,
                          parser_kwargs={"prog": PROG, "exit_on_error": False, "description": description,
                                         "formatter_class": help_formatter()})
        trainer, system = cli.trainer, cli.model
        # a second fit exporting to the same --export_dir is refused before it trains (a default export
        # goes to this run's own version directory), and so is one over another fit's finished export
        run = run_id(trainer.logger.log_dir if trainer.logger else "checkpoints")  # this fit's, as exports record it
        if cli.config.export_dir and trainer.is_global_zero:
            check_export_dir(cli.config.export_dir, run)
        # and so is a second fit in this fit's run directory (a fixed version, or a stopped run it would resume)
        run_dir = trainer.logger.log_dir if trainer.logger else None
        with (claim(cli.config.export_dir, "--export_dir") if cli.config.export_dir else nullcontext(),
              claim(run_dir, "--trainer.logger.init_args.version") if run_dir else nullcontext()):
            try:
                with ctrl_c_as_sigterm() as ctrl_c:
                    trainer.fit(system, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
            except SIGTERMException:
                if ctrl_c.pressed:
                    return _stopped(trainer, "Ctrl-C (SIGINT)", 130, args)
                return _stopped(trainer, "SIGTERM", 128 + 15, args)
            except SystemExit as e:  # Lightning turns Ctrl-C into sys.exit(1) after its on_exception hooks
                if trainer.interrupted:
                    return _stopped(trainer, "SIGINT", 130, args)
                raise e
            step = best_or_last_weights(trainer, system)
            log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
            if trainer.is_global_zero:
                out = cli.config.export_dir or str(Path(log_dir or "checkpoints") / "reranker")
                kept = getattr(trainer.checkpoint_callback, "validations", {}) or {}
                val = kept.get(step) or {k: round(float(v), 6) for k, v in trainer.callback_metrics.items()
                                         if k.startswith("val/")}  # the exported weights' validation
                export(system, out, trained={"precision": str(trainer.precision), "steps": step,
                                             "fit_steps": trainer.global_step, "data": data_identity(cli.config.data.data_dir),
                                             "run": run,
                                             **({"validation": val} if val else {})})
                what = "the untrained start (0 steps)" if trainer.global_step == 0 else f"the reranker (step {step})"
                print(f"exported {what} to {out}", file=sys.stderr)
    except USER_ERRORS as e:
        return error(PROG, e)
    except ArgumentError as e:
        return error(PROG, f"{e} (see {PROG} --help)")
    except KeyboardInterrupt:  # outside the fit (its set-up, the export): nothing half-written, the rerun continues
        print(f"{PROG}: interrupted; rerun the same command to continue", file=sys.stderr)
        return 130
    return cli
