"""The rerankers an evaluation can use, by name or path: one registry for ``eval.ppl``, ``eval.generate``,
``eval.qa`` and the pipeline.

A reranker is a built-in name (:data:`BUILTIN_RERANKERS`) or the path of a trained one (an export directory or
a Lightning ``.ckpt`` of ``reranking.fit``). :func:`check_reranker` refuses a bad one before any heavy work,
:func:`make_selector` builds the selector the loop calls (what a run's results depend on in a reranker is
:func:`eval.results.reranker_identity`).
"""

from __future__ import annotations

from pathlib import Path

from ralm.loading import load_causal_lm
from ralm.scoring import context_length
from ralm.selectors import BUILTIN, RandomCandidate, ZeroShotOtherLM
from ralm.settings import RERANKER_NAMES, InputError, Ranker, Scoring, Windows
from reranking.encoder_selectors import CosineSelector, PredictiveSelector
from reranking.export import check_reranker as check_export

BUILTIN_RERANKERS = RERANKER_NAMES
#: Rerankers that score every candidate with an LM forward to choose (k LM rows per stride; the -abstain ones
#: also the window without a passage, which they may keep).
LM_RANKERS = ("zero-shot", "oracle", "zero-shot-abstain", "oracle-abstain")


def is_trained(reranker: str) -> bool:
    """A path (an export or a checkpoint), not a built-in name."""
    return reranker not in BUILTIN_RERANKERS


def check_reranker(reranker: str, ranker: Ranker) -> bool:
    """Cheap checks before any loading; returns whether the reranker reads retrieved documents."""
    if is_trained(reranker) and not Path(reranker).exists():
        raise InputError(f"--reranker {reranker!r}: not one of {', '.join(BUILTIN_RERANKERS)} and no such file or "
                         "directory (a trained reranker is an export directory or a Lightning .ckpt of reranking.fit)")
    if reranker == "zero-shot-abstain" and ranker.model:
        raise InputError("--reranker zero-shot-abstain ranks with the evaluated LM; --ranker.model (another LM) "
                         "is for zero-shot")
    if reranker == "cosine" and not ranker.model:
        raise InputError("--reranker cosine needs --ranker.model (a sentence encoder, e.g. minilm-l6)")
    if is_trained(reranker):
        try:
            check_export(reranker)
        except InputError as e:
            raise InputError(f"--reranker: {e}") from None
    return reranker != "none"


def make_selector(reranker: str, ranker: Ranker, model: str, seed: int, *, windows: Windows, max_length: int,
                  scoring: Scoring):
    """The selector of ``reranker`` (:mod:`ralm.selectors`, :mod:`reranking.encoder_selectors`); ``model`` is
    the evaluated LM (zero-shot ranks with it unless ``ranker.model`` names another)."""
    if reranker == "random":
        return RandomCandidate(seed)
    if reranker == "cosine":
        return CosineSelector(ranker.model, input=ranker.input, batch_size=ranker.batch_size)
    if reranker == "zero-shot" and ranker.model and ranker.model != model:
        zs_model, zs_tok = load_causal_lm(ranker.model, "cpu", role="--ranker.model")
        return ZeroShotOtherLM(zs_model, zs_tok, rank_tokens=windows.zero_shot_tokens,
                               doc_max_tokens=windows.doc_max_tokens, max_length=min(max_length, context_length(zs_model)),
                               batch_size=scoring.batch_size, dtype=scoring.dtype)
    if reranker in BUILTIN:
        return BUILTIN[reranker]()
    try:
        return PredictiveSelector.from_path(reranker, batch_size=ranker.batch_size)
    except (FileNotFoundError, ValueError, KeyError, RuntimeError) as e:
        raise InputError(f"--reranker {reranker!r}: {e}") from None
