"""Train the predictive reranker: ``python -m reranking.fit --config configs/fit.yaml``.

A ``LightningCLI(run=False)`` over :class:`~reranking.system.RerankerSystem` (``model:``) and
:class:`~reranking.data.RerankDataModule` (``data:``) plus ``trainer:``; ``--print_config`` prints the
resolved config, and each run saves it next to its logs. Defaults: TensorBoard logs under
``checkpoints/reranker/version_N/``, a ``ModelCheckpoint`` there keeping the best chosen-passage NLL
(``val/nll_reranker``) and ``last.ckpt``. Resume with ``--ckpt_path .../last.ckpt``. At the end the
best checkpoint (or the final weights if there is none) is exported to ``<run dir>/reranker/``
(see :mod:`reranking.export`), loadable with ``reranking.export.load_reranker``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI

from reranking.data import RerankDataModule
from reranking.system import MONITOR, RerankerSystem


class RerankerCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="Resume training from this Lightning checkpoint (e.g. .../last.ckpt).")
        parser.add_argument("--export_dir", type=str | None, default=None,
                            help="Where to export the final reranker (default: <run dir>/reranker).")
        # One source of truth for the tokenizer and the input format: the model's settings.
        parser.link_arguments("model.encoder", "data.tokenizer")
        parser.link_arguments("model.max_length", "data.max_length")
        parser.link_arguments("model.max_prefix_tokens", "data.max_prefix_tokens")
        parser.set_defaults({
            "trainer.logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": "checkpoints", "name": "reranker",
                                             "default_hp_metric": False}},
            "trainer.callbacks": [
                {"class_path": "reranking.callbacks.RerankerCheckpoint",
                 "init_args": {"monitor": MONITOR, "mode": "min", "save_last": True,
                               "filename": "best-step{step:06d}", "auto_insert_metric_name": False}},
            ],
        })


def best_or_last_weights(trainer, system) -> None:
    """Load the best checkpoint's weights into ``system`` (if ModelCheckpoint kept one)."""
    import torch

    ckpt = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
    if ckpt and Path(ckpt).is_file():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
        system.load_state_dict(state, strict=True)


def main(args: list[str] | None = None) -> RerankerCLI:
    """Run training (``args`` as on the command line; ``None`` = ``sys.argv[1:]``); returns the CLI."""
    from reranking.export import export

    cli = RerankerCLI(RerankerSystem, RerankDataModule, run=False, args=args,
                      save_config_kwargs={"overwrite": True}, subclass_mode_model=False)
    trainer, system = cli.trainer, cli.model
    trainer.fit(system, datamodule=cli.datamodule, ckpt_path=cli.config.ckpt_path)
    best_or_last_weights(trainer, system)
    log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
    if trainer.is_global_zero:
        out = cli.config.export_dir or str(Path(log_dir or "checkpoints") / "reranker")
        export(system, out)
        print(f"exported reranker to {out}", file=sys.stderr)
    return cli


if __name__ == "__main__":
    main()
