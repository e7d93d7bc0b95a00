"""The LightningModule that trains a reranker (:mod:`reranking.model`) with a listwise loss."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import lightning.pytorch as pl
import torch
from torchmetrics import SumMetric
from torchmetrics.functional.retrieval import retrieval_normalized_dcg
from transformers import get_linear_schedule_with_warmup

from ralm.loading import load_tokenizer
from ralm.settings import EncoderInput, SettingsError
from reranking.export import load_reranker
from reranking.inputs import InputFormat
from reranking.loss import DistillationLoss, ExpectedNLLLoss, MarginalLikelihoodLoss
from reranking.model import make_model, max_input_tokens

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


@dataclass(frozen=True)
class Optimizer:
    """AdamW with linear warm-up and linear decay to 0 (the paper's schedule).

    Args:
        lr: Peak learning rate.
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        warmup_steps: Optimizer steps of linear warm-up from 0 to lr; then linear decay to 0.
        total_steps: Length of the schedule in optimizer steps (default: the trainer's max_steps).
    """

    lr: float = 1e-5
    weight_decay: float = 0.01
    warmup_steps: int = 1000
    total_steps: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if not self.lr > 0:
            problems.append(f"--model.optimizer.lr {self.lr} must be > 0")
        if self.warmup_steps < 0:
            problems.append(f"--model.optimizer.warmup_steps {self.warmup_steps} must be >= 0")
        if self.total_steps is not None and self.total_steps <= self.warmup_steps:
            problems.append(f"--model.optimizer.total_steps {self.total_steps} must exceed warmup_steps "
                            f"{self.warmup_steps}")
        if problems:
            raise SettingsError("invalid optimizer settings: " + "; ".join(problems))


class RerankerSystem(pl.LightningModule):
    """Trains f(x, d) so that softmax(f) over BM25's k candidates puts mass where the LM is helped most.

    The model (:mod:`reranking.model`), the loss (:mod:`reranking.loss`) and the optimiser; what a checkpoint
    records about the reranker and the random state are :class:`reranking.callbacks.RerankerState`'s.

    Args:
        encoder: encoder hub name or local directory (``roberta-base`` in the paper).
        pretrained: start from the encoder's pretrained weights (``False``: random init, for tests).
        architecture: ``cross`` (the paper's cross-encoder) or ``bi`` (cosine of mean-pooled
            embeddings / ``cosine_temperature``; untrained, it ranks as ``eval.ppl --reranker cosine``).
        input: what the encoder reads of prefix and passage (lengths, dropped strings); the data module
            reads the same (:class:`~ralm.settings.EncoderInput`).
        bm25_weight: the score is f(x, d) + ``bm25_weight`` × BM25(x, d), a fixed prior that training
            corrects (0: the paper's reranker; see :class:`reranking.inputs.InputFormat`).
        cosine_temperature: bi: τ dividing the cosine (cosines lie in [-1, 1]; the loss needs wider logits).
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
        abstain: every candidate list also holds "no passage", trained on the LM's log-probability without
            one (the data's ``nodoc_logprob``); a reranker that chooses it keeps the window's own tokens
            (:attr:`reranking.inputs.InputFormat.abstain`; off: the paper's, which always retrieves).
        init_from: a reranker export (encoder *and* head, e.g. one pretrained on other data) whose
            weights to start from; its architecture must be ``encoder``'s. Use ``pretrained: false``.
        loss: ``"marginal"`` (marginal likelihood, the paper's), ``"distill"`` (KL to softmax(lm/τ)) or
            ``"expected"`` (the targets' expected NLL under softmax(f), :class:`reranking.loss.ExpectedNLLLoss`).
        temperature: τ of the distillation target (``loss="distill"`` only).
        optimizer: AdamW's learning rate, weight decay and schedule.
    """

    def __init__(self, encoder: str = "roberta-base", pretrained: bool = True, architecture: str = "cross",
                 input: EncoderInput = EncoderInput(), bm25_weight: float = 0.0, cosine_temperature: float = 0.05,
                 passage_grad: bool = True, frozen_passages: bool = False, attention_dropout: float | None = None,
                 hidden_dropout: float | None = None, abstain: bool = False, init_from: str | None = None,
                 loss: str = "marginal", temperature: float = 1.0, optimizer: Optimizer = Optimizer()):
        super().__init__()
        input = input if isinstance(input, EncoderInput) else EncoderInput(**input)  # hparams of a checkpoint
        optimizer = optimizer if isinstance(optimizer, Optimizer) else Optimizer(**optimizer)
        if loss not in LOSSES:
            raise SettingsError(f"RerankerSystem: loss={loss!r} must be one of {', '.join(map(repr, LOSSES))} "
                                "(--model.loss)")
        # plain values only: checkpoints are read with torch.load(weights_only=True)
        self.save_hyperparameters({"encoder": encoder, "pretrained": pretrained, "architecture": architecture,
                                   "input": asdict(input), "bm25_weight": bm25_weight,
                                   "cosine_temperature": cosine_temperature, "passage_grad": passage_grad,
                                   "frozen_passages": frozen_passages, "attention_dropout": attention_dropout,
                                   "hidden_dropout": hidden_dropout, "abstain": abstain, "init_from": init_from,
                                   "loss": loss,
                                   "temperature": temperature, "optimizer": asdict(optimizer)})
        self.optim = optimizer
        self.fmt = InputFormat.of(input, architecture, bm25_weight, abstain)
        try:
            self.model = make_model(architecture, encoder, pretrained=pretrained, temperature=cosine_temperature,
                                    passage_grad=passage_grad, attention_dropout=attention_dropout,
                                    frozen_passages=frozen_passages, hidden_dropout=hidden_dropout)
        except ValueError as e:
            raise SettingsError(f"RerankerSystem: {e}") from None
        if init_from is not None:
            start, _, _ = load_reranker(init_from)
            try:
                self.model.load_state_dict(start.state_dict(), strict=True)
            except RuntimeError as e:
                raise ValueError(f"RerankerSystem: init_from={init_from!r} does not fit encoder={encoder!r} "
                                 f"(use the export's own directory as --model.encoder): {e}") from None
        self.fmt.check_encoder(max_input_tokens(self.model.config), name=encoder)
        self.loss_fn = (DistillationLoss(temperature) if loss == "distill"
                        else ExpectedNLLLoss() if loss == "expected" else MarginalLikelihoodLoss())
        self.val_sums = torch.nn.ModuleDict({k: SumMetric() for k in _SUMS})
        self._tokenizer = None

    # ---------------------------------------------------------------- scoring
    @property
    def tokenizer(self):
        if self._tokenizer is None:
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
        o = self.optim
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=o.lr)
        if o.total_steps:
            total = o.total_steps
        elif self.trainer.max_steps == 0:  # the untrained start: nothing steps, any schedule will do
            total = o.warmup_steps + 1
        else:
            total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total) or total <= o.warmup_steps:
            raise ValueError(f"schedule length {total} optimizer steps must be finite and exceed warmup_steps="
                             f"{o.warmup_steps}; set --trainer.max_steps or --model.optimizer.total_steps")
        sched = get_linear_schedule_with_warmup(opt, o.warmup_steps, int(total))
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
