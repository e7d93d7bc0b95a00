"""The LightningModule that trains a reranker (:mod:`reranking.model`) with a listwise loss."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from torchmetrics import SumMetric
from torchmetrics.functional.retrieval import retrieval_normalized_dcg

from reranking.export import CKPT_META_KEY
from reranking.inputs import InputFormat
from reranking.loss import DistillationLoss, ExpectedNLLLoss, MarginalLikelihoodLoss
from reranking.model import make_model

MONITOR = "val/nll_reranker"
LOSSES = ("marginal", "distill", "expected")

_SUMS = ("loss", "n", "nll_reranker", "nll_bm25", "nll_oracle", "top1", "nll_nodoc", "n_nodoc", "rr", "ndcg")


def reciprocal_rank(scores: torch.Tensor, relevant: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Reciprocal rank of the first relevant candidate when each row is sorted by score, ``FloatTensor[B]``.

    ``scores``, ``relevant``, ``mask``: ``[B, k]``. Scores may be any real numbers (negative included:
    torchmetrics' ``retrieval_reciprocal_rank`` counts a candidate with a score <= 0 as irrelevant, which
    made MRR 0 for a reranker whose scores are all negative). Ties keep candidate order (BM25's), as
    ``argmax`` does, so rank 1 agrees with the candidate the reranker picks. Masked candidates are
    never ranked; a row with no relevant real candidate gets 0.
    """
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=scores.device)
    order = torch.sort(torch.where(mask, scores.float(), neg_inf), dim=1, descending=True, stable=True).indices
    hit = (relevant & mask).gather(1, order)                                  # [B, k] in ranked order
    pos = torch.arange(1, scores.shape[1] + 1, device=scores.device, dtype=torch.float32)
    rr = (hit.float() / pos).masked_fill(~hit, 0.0)
    return rr.max(dim=1).values  # 1 / position of the first hit (positions increase along the row)


class RerankerSystem(pl.LightningModule):
    """Trains f(x, d) so that softmax(f) over BM25's k candidates puts mass where the LM is helped most.

    Args:
        encoder: encoder hub name or local directory (``roberta-base`` in the paper).
        pretrained: start from the encoder's pretrained weights (``False``: random init, for tests).
        architecture: ``cross`` (the paper's cross-encoder) or ``bi`` (cosine of mean-pooled
            embeddings / ``cosine_temperature``; untrained, it ranks as ``eval.ppl --reranker cosine``).
        max_length: cross: encoder tokens per (prefix, passage) pair, special tokens included.
        max_prefix_tokens: encoder tokens kept from the end of the prefix.
        max_passage_tokens: bi: encoder tokens kept from the start of the passage.
        loss: ``"marginal"`` (marginal likelihood, the paper's), ``"distill"`` (KL to softmax(lm/τ)) or
            ``"expected"`` (the targets' expected NLL under softmax(f), :class:`reranking.loss.ExpectedNLLLoss`).
        temperature: τ of the distillation target (``loss="distill"`` only).
        lr: peak learning rate (AdamW).
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        warmup_steps: optimizer steps of linear warm-up from 0 to ``lr``; then linear decay to 0.
        total_steps: length of the schedule in optimizer steps; default: the trainer's ``max_steps``.
        cosine_temperature: bi: τ dividing the cosine (cosines lie in [-1, 1]; the loss needs wider logits).
        bm25_weight: the score is f(x, d) + ``bm25_weight`` × BM25(x, d), a fixed prior that training
            corrects (0: the paper's reranker; see :class:`reranking.inputs.InputFormat`).
        passage_grad: bi: ``False`` trains through the prefix's embedding only (passages embedded by the
            same encoder without a gradient or dropout; a fraction of a step's cost, ``bench/fit_step.py``).
        frozen_passages: bi: passages embedded by a frozen copy of the starting encoder, each computed once and
            cached, so only the prefix tower trains and a step costs the prefixes alone
            (:class:`~reranking.model.BiEncoder`; REPLUG's query-side training).
        attention_dropout: the encoder's dropout on attention probabilities (``None``: its config's, 0.1
            for MiniLM). On a CPU, drawing that mask is about a third of a training step (``bench/fit_step.py``).
        hidden_dropout: the encoder's dropout on hidden states (``None``: its config's, 0.1 for MiniLM), drawn
            twice a layer over every token; on a CPU the largest cost besides the matrix products once
            attention dropout is off.
        drop: strings the reranker never reads, in training and in every use of its export (e.g.
            ``["<unk>"]`` for WikiText-2 train; :attr:`reranking.inputs.InputFormat.drop`).
        init_from: a reranker export (encoder *and* head, e.g. one pretrained on other data) whose
            weights to start from; its architecture must be ``encoder``'s. Use ``pretrained: false``.
    """

    def __init__(self, encoder: str = "roberta-base", pretrained: bool = True, max_length: int = 512,
                 max_prefix_tokens: int = 256, loss: str = "marginal", temperature: float = 1.0,
                 lr: float = 1e-5, weight_decay: float = 0.01, warmup_steps: int = 1000,
                 total_steps: int | None = None, init_from: str | None = None, architecture: str = "cross",
                 max_passage_tokens: int = 256, cosine_temperature: float = 0.05, bm25_weight: float = 0.0,
                 passage_grad: bool = True, attention_dropout: float | None = None,
                 drop: list[str] | None = None, frozen_passages: bool = False,
                 hidden_dropout: float | None = None):
        super().__init__()
        problems = []
        if loss not in LOSSES:
            problems.append(f"loss={loss!r} must be one of {', '.join(map(repr, LOSSES))} (--model.loss)")
        if not lr > 0:
            problems.append(f"lr={lr} must be > 0 (--model.lr)")
        if warmup_steps < 0:
            problems.append(f"warmup_steps={warmup_steps} must be >= 0 (--model.warmup_steps)")
        if total_steps is not None and total_steps <= warmup_steps:
            problems.append(f"total_steps={total_steps} must exceed warmup_steps={warmup_steps}")
        if problems:
            from ralm.settings import SettingsError

            raise SettingsError("RerankerSystem: " + "; ".join(problems))
        self.save_hyperparameters()
        self.fmt = InputFormat(max_length=max_length, max_prefix_tokens=max_prefix_tokens,
                               architecture=architecture, max_passage_tokens=max_passage_tokens,
                               bm25_weight=bm25_weight, drop=drop)
        try:
            self.model = make_model(architecture, encoder, pretrained=pretrained, temperature=cosine_temperature,
                                    passage_grad=passage_grad, attention_dropout=attention_dropout,
                                    frozen_passages=frozen_passages, hidden_dropout=hidden_dropout)
        except ValueError as e:
            from ralm.settings import SettingsError

            raise SettingsError(f"RerankerSystem: {e}") from None
        if init_from is not None:
            from reranking.export import load_reranker

            start, _, _ = load_reranker(init_from)
            try:
                self.model.load_state_dict(start.state_dict(), strict=True)
            except RuntimeError as e:
                raise ValueError(f"RerankerSystem: init_from={init_from!r} does not fit encoder={encoder!r} "
                                 f"(use the export's own directory as --model.encoder): {e}") from None
        cfg = self.model.config
        offset = 2 if cfg.model_type in ("roberta", "xlm-roberta", "camembert") else 0
        self.fmt.check_encoder(getattr(cfg, "max_position_embeddings", None), offset, name=encoder)
        self.loss_fn = (DistillationLoss(temperature) if loss == "distill"
                        else ExpectedNLLLoss() if loss == "expected" else MarginalLikelihoodLoss())
        self.val_sums = torch.nn.ModuleDict({k: SumMetric() for k in _SUMS})
        self._tokenizer = None
        self._meta = None

    # ---------------------------------------------------------------- scoring
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from ralm.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.hparams.encoder)
        return self._tokenizer

    def score_batch(self, batch: dict) -> torch.Tensor:
        """Scores ``[B, k]`` for a collated batch (``P`` pair scores scattered into ``mask[B, k]``, plus the
        BM25 prior if the format has one; -inf on padding)."""
        mask = batch["mask"]
        f = self.model(**{k: batch[k] for k in self.model.input_keys if k in batch})  # [P]
        if f.shape[0] != int(mask.sum()):
            raise ValueError(f"batch has {f.shape[0]} pairs but mask {tuple(mask.shape)} marks {int(mask.sum())}")
        scores = torch.full(mask.shape, float("-inf"), device=f.device, dtype=f.dtype).masked_scatter(mask, f)
        if not self.fmt.bm25_weight:
            return scores
        if "bm25" not in batch:
            raise ValueError(f"bm25_weight={self.fmt.bm25_weight} needs the candidates' BM25 scores, and this batch "
                             "has none: the training data lacks a bm25_scores column (regenerate it with data_gen.build) "
                             "or set --model.bm25_weight 0")
        return self.fmt.with_bm25(scores, batch["bm25"])

    # ---------------------------------------------------------------- training
    def training_step(self, batch, batch_idx):
        scores = self.score_batch(batch)
        loss = self.loss_fn(scores, batch["lm_logprobs"], batch["mask"])
        # Per-rank values, no cross-rank sync per step (that would cost a collective per log call).
        self.log("train/loss", loss, prog_bar=True, batch_size=scores.shape[0])
        self.log("train/lr", self.lr_schedulers().get_last_lr()[0], batch_size=scores.shape[0])
        return loss

    def configure_optimizers(self):
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.hparams.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=self.hparams.lr)
        total = self.hparams.total_steps or self.trainer.estimated_stepping_batches
        if not math.isfinite(total) or total <= self.hparams.warmup_steps:
            raise ValueError(f"schedule length {total} optimizer steps must be finite and exceed warmup_steps="
                             f"{self.hparams.warmup_steps}; set --trainer.max_steps or --model.total_steps")
        from transformers import get_linear_schedule_with_warmup

        sched = get_linear_schedule_with_warmup(opt, self.hparams.warmup_steps, int(total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}

    # ---------------------------------------------------------------- validation
    def validation_step(self, batch, batch_idx):
        mask, lm = batch["mask"], batch["lm_logprobs"].float()
        scores = self.score_batch(batch)                                 # [B, k]
        B = scores.shape[0]
        losses = self.loss_fn.per_example(scores, lm, mask)              # [B]
        lm_masked = lm.masked_fill(~mask, float("-inf"))                 # [B, k]
        chosen = scores.argmax(dim=1)                                    # [B]
        oracle_lp, oracle = lm_masked.max(dim=1)                         # [B]
        s = self.val_sums
        s["loss"].update(losses.sum())
        s["n"].update(torch.tensor(float(B), device=scores.device))
        s["nll_reranker"].update(-lm.gather(1, chosen[:, None]).sum())
        s["nll_bm25"].update(-lm[:, 0].sum())                            # index 0 = BM25's first
        s["nll_oracle"].update(-oracle_lp.sum())
        s["top1"].update((lm.gather(1, chosen[:, None]).squeeze(1) == oracle_lp).float().sum())
        nodoc = batch["nodoc_logprob"].float()
        has = ~torch.isnan(nodoc)
        s["nll_nodoc"].update(-nodoc[has].sum())
        s["n_nodoc"].update(has.float().sum())
        # Retrieval metrics per example over its real candidates, summed here and divided by the count
        # at the end (a per-example sum all-reduces exactly; no gathering of every score to one rank).
        # MRR: relevant = the oracle-best candidate(s). NDCG: graded relevance exp(lp_j - max lp) in (0, 1],
        # the candidate's likelihood relative to the best one.
        rr = reciprocal_rank(scores, lm_masked == oracle_lp[:, None], mask).sum()
        ndcg = scores.new_zeros(())
        for b in range(B):
            m = mask[b]
            ndcg = ndcg + retrieval_normalized_dcg(scores[b, m], (lm[b, m] - oracle_lp[b]).exp())
        s["rr"].update(rr)
        s["ndcg"].update(ndcg)

    def on_validation_epoch_end(self):
        # SumMetric.compute() all-reduces sums across ranks: totals first, ratios last (never means of means).
        t = {k: m.compute() for k, m in self.val_sums.items()}
        n = t["n"].clamp_min(1)
        out = {
            "val/loss": t["loss"] / n,
            "val/nll_reranker": t["nll_reranker"] / n,
            "val/nll_bm25": t["nll_bm25"] / n,
            "val/nll_oracle": t["nll_oracle"] / n,
            "val/top1_agreement": t["top1"] / n,
            "val/gap_captured": (t["nll_bm25"] - t["nll_reranker"]) / (t["nll_bm25"] - t["nll_oracle"]).clamp_min(1e-12),
            "val/mrr": t["rr"] / n,
            "val/ndcg": t["ndcg"] / n,
            "val/examples": t["n"],
        }
        if t["n_nodoc"] > 0:
            out["val/nll_nodoc"] = t["nll_nodoc"] / t["n_nodoc"]
        for k, v in out.items():
            # Already identical on every rank; sync_dist averages identical values (exact), which keeps
            # Lightning from warning and every rank's ModelCheckpoint seeing the same number.
            self.log(k, v.float(), prog_bar=k in ("val/nll_reranker", "val/gap_captured"), sync_dist=True)
        for m in self.val_sums.values():
            m.reset()

    # ---------------------------------------------------------------- self-description
    def reranker_meta(self) -> dict:
        """What a checkpoint needs to rebuild the reranker with no training config and no download."""
        if self._meta is None:
            files = {}
            with tempfile.TemporaryDirectory() as tmp:
                self.tokenizer.save_pretrained(tmp)
                for p in sorted(Path(tmp).iterdir()):
                    if p.is_file():
                        files[p.name] = p.read_bytes()
            self._meta = {"format": "ralm-reranker", "version": 1, "encoder": self.hparams.encoder,
                          "encoder_config": self.model.config.to_json_string(),
                          "input_format": self.fmt.to_dict(), "tokenizer_files": files,
                          "cosine_temperature": getattr(self.model, "temperature", None),
                          "frozen_passages": getattr(self.model, "frozen_passages", False)}
        return self._meta

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        from lightning.fabric.utilities.seed import _collect_rng_states

        checkpoint[CKPT_META_KEY] = self.reranker_meta()
        # dropout's random state, so that a resumed run draws what the uninterrupted one would have
        # (numpy's key array as a tensor: checkpoints stay loadable with torch.load(weights_only=True))
        states = _collect_rng_states(include_cuda=torch.cuda.is_available())
        name, keys, pos, has_gauss, gauss = states["numpy"]
        states["numpy"] = (name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss)
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        from lightning.fabric.utilities.seed import _set_rng_states

        if "rng_states" in checkpoint:
            states = dict(checkpoint["rng_states"])
            name, keys, pos, has_gauss, gauss = states["numpy"]
            states["numpy"] = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss)
            _set_rng_states(states)
