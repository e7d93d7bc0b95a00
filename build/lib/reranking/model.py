"""The reranker models: plain ``nn.Module``s with no training logic (see :mod:`reranking.system`).

Two architectures score f(x, d) for a prefix x and a passage d:

* :class:`CrossEncoder` (``cross``, the paper's): one encoder reads the pair, a linear head scores it.
* :class:`BiEncoder` (``bi``): prefix and passage are embedded separately (mean-pooled, L2-normalised)
  and f = cosine / τ. Before any training it *is* the cosine ranking of a sentence encoder such as
  all-MiniLM-L6-v2 (``eval.ppl --reranker cosine``), so that row is exactly its ablation. With
  ``frozen_passages`` only its prefix tower trains; passages keep the starting encoder's embeddings.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModel

from ralm.loading import check_encoder, load_config
from ralm.models import resolve


def _encoder(encoder: str, pretrained: bool, config, attention_dropout: float | None = None,
             hidden_dropout: float | None = None):
    """An ``AutoModel`` in train mode without its pooler (unused parameters break DDP); ``attention_dropout``
    and ``hidden_dropout`` replace the config's dropout on attention probabilities and on hidden states
    (``None``: the encoder's own)."""
    given = config is not None
    config = config if given else load_config(encoder)
    check_encoder(str(encoder), config)
    for value, attr, flag in ((attention_dropout, "attention_probs_dropout_prob", "attention_dropout"),
                              (hidden_dropout, "hidden_dropout_prob", "hidden_dropout")):
        if value is None:
            continue
        if not 0 <= value < 1:
            raise ValueError(f"{flag}={value} must be in [0, 1) (--model.{flag})")
        if not hasattr(config, attr):
            raise ValueError(f"--model.{flag}: {type(config).__name__} has no {attr} "
                             "to replace; leave it unset (null) for this encoder")
        setattr(config, attr, float(value))
    if pretrained and not given:
        r = resolve(encoder)
        model = AutoModel.from_pretrained(r.path, config=config, **r.kwargs())
    else:
        model = AutoModel.from_config(config)
    # from_pretrained returns the model in eval mode, and Lightning keeps module modes as it finds
    # them: without this, fine-tuning a pretrained encoder would silently run with dropout off.
    model.train()
    if getattr(model, "pooler", None) is not None:
        model.pooler = None
    return model


class CrossEncoder(nn.Module):
    """f(x, d): a transformer encoder over the (prefix, passage) pair + a linear head on the first token.

    Args:
        encoder: the encoder (``AutoModel``): a short name such as ``minilm-l6``, a local directory
            or a hub id (see :func:`ralm.models.resolve`).
        pretrained: load the encoder's weights (``True``) or only its config, with random weights
            (``False``; used when weights come from an export or a checkpoint next).
        config: an encoder config object to build from instead of ``encoder`` (implies random weights).

    The encoder's pooler (if any) is dropped: it is unused, and unused parameters break DDP.
    """
    architecture = "cross"
    input_keys = ("input_ids", "attention_mask", "token_type_ids")

    def __init__(self, encoder: str = "roberta-base", pretrained: bool = True, config=None,
                 attention_dropout: float | None = None, hidden_dropout: float | None = None):
        super().__init__()
        self.encoder = _encoder(encoder, pretrained, config, attention_dropout, hidden_dropout)
        self.head = nn.Linear(self.encoder.config.hidden_size, 1)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    @property
    def config(self):
        return self.encoder.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Score pairs.

        Args:
            input_ids: ``LongTensor[N, T]`` pair tokens from :func:`reranking.inputs.encode_pairs`.
            attention_mask: ``LongTensor[N, T]``, 1 on real tokens.
            token_type_ids: optional ``LongTensor[N, T]`` (BERT-style encoders).

        Returns:
            ``FloatTensor[N]``: one scalar score per pair (float32 whatever the autocast dtype).
        """
        if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(f"CrossEncoder.forward: input_ids {tuple(input_ids.shape)} and attention_mask "
                             f"{tuple(attention_mask.shape)} must both be [N, T]")
        if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
            raise ValueError(f"CrossEncoder.forward: token_type_ids {tuple(token_type_ids.shape)} must match "
                             f"input_ids {tuple(input_ids.shape)}")
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        cls = hidden[:, 0]  # [N, H]: first token (<s> / [CLS])
        return self.head(cls).squeeze(-1).float()  # [N]


class BiEncoder(nn.Module):
    """f(x, d) = cos(E(x), E(d)) / τ with one shared encoder E: mean pooling over real tokens, L2 norm.

    Args:
        encoder, pretrained, config: as for :class:`CrossEncoder`.
        temperature: τ. Cosines lie in [-1, 1]; the marginal-likelihood loss needs a wider range of
            logits to express a confident choice (0.05, as in contrastive sentence-encoder training).
        passage_grad: ``False`` embeds passages without a gradient and without dropout (query-side
            fine-tuning: RAG trains only its query encoder against a fixed document encoder): the same
            shared encoder and, at evaluation, the same scores, but a training step skips the backward
            pass through its k passages per prefix and their dropout, most of the step's cost.
        frozen_passages: passages are embedded by a frozen copy of the starting encoder (REPLUG's LM-supervised
            retrieval trains only its query encoder, so that the document index stays valid): the copy never
            trains and runs without dropout, so a passage's embedding is computed once and cached for the
            rest of the run (a training set's 200,000 candidate slots hold ~13,000 distinct passages), and a
            training step costs the prefixes' forward and backward alone. Untrained, it equals the shared
            model. The copy is part of the weights (exports and checkpoints carry both encoders).
        attention_dropout: replaces the encoder's dropout on attention probabilities (``None``: keep it).
        hidden_dropout: replaces the encoder's dropout on hidden states (``None``: keep it).
    """
    architecture = "bi"
    input_keys = ("query_input_ids", "query_attention_mask", "passage_input_ids", "passage_attention_mask",
                  "pair_query")

    def __init__(self, encoder: str = "sentence-transformers/all-MiniLM-L6-v2", pretrained: bool = True,
                 config=None, temperature: float = 0.05, passage_grad: bool = True,
                 attention_dropout: float | None = None, frozen_passages: bool = False,
                 hidden_dropout: float | None = None):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"BiEncoder: temperature={temperature} must be > 0 (--model.cosine_temperature)")
        self.encoder = _encoder(encoder, pretrained, config, attention_dropout, hidden_dropout)
        self.temperature = float(temperature)
        self.passage_grad = bool(passage_grad)
        self.passage_encoder = None
        self._frozen: dict[bytes, torch.Tensor] = {}  # a passage's real token ids -> its embedding
        if frozen_passages:
            self.passage_encoder = copy.deepcopy(self.encoder).eval().requires_grad_(False)
            # new weights (an export, a checkpoint, init_from) make every cached embedding stale
            self.register_load_state_dict_post_hook(lambda module, keys: module._frozen.clear())

    @property
    def frozen_passages(self) -> bool:
        return self.passage_encoder is not None

    def train(self, mode: bool = True) -> "BiEncoder":
        super().train(mode)
        if self.passage_encoder is not None:
            self.passage_encoder.eval()  # frozen: no dropout, ever
        return self

    @property
    def config(self):
        return self.encoder.config

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, passages: bool = False) -> torch.Tensor:
        """``FloatTensor[N, H]``: L2-normalised mean of the last hidden states over real tokens; ``passages``:
        by the passage tower (the frozen copy where there is one, else the shared encoder)."""
        encoder = self.passage_encoder if passages and self.passage_encoder is not None else self.encoder
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return nn.functional.normalize(pooled.float(), dim=-1)

    def forward(self, query_input_ids: torch.Tensor, query_attention_mask: torch.Tensor,
                passage_input_ids: torch.Tensor, passage_attention_mask: torch.Tensor,
                pair_query: torch.Tensor) -> torch.Tensor:
        """Score pairs: ``FloatTensor[P]``, pair j = (query ``pair_query[j]``, passage j).

        Queries ``[Q, Tq]`` and passages ``[P, Tp]`` come from :func:`reranking.inputs.encode_texts`
        (the collator builds them); ``pair_query``: ``LongTensor[P]`` indices into the queries.
        """
        if pair_query.shape != passage_input_ids.shape[:1]:
            raise ValueError(f"BiEncoder.forward: pair_query {tuple(pair_query.shape)} must have one entry per "
                             f"passage ({passage_input_ids.shape[0]})")
        q = self.embed(query_input_ids, query_attention_mask)
        if self.passage_encoder is not None:
            d = self._frozen_embeddings(passage_input_ids, passage_attention_mask).to(q.device)
        elif self.passage_grad or not torch.is_grad_enabled():
            d = self.embed(passage_input_ids, passage_attention_mask)
        else:  # a fixed target, as from a frozen document encoder: no gradient, no dropout
            mode = self.encoder.training
            self.encoder.eval()
            try:
                with torch.no_grad():
                    d = self.embed(passage_input_ids, passage_attention_mask)
            finally:
                self.encoder.train(mode)
        return (q[pair_query] * d).sum(-1) / self.temperature

    @torch.no_grad()
    def _frozen_embeddings(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The frozen tower's embeddings ``[P, H]``, each passage computed once per process (keyed by its real
        token ids; the passages not yet cached are embedded together, without the columns that are padding in
        all of them). Lightning's note that modules are in eval mode at the start of training is this tower."""
        ids_cpu, mask_cpu = input_ids.cpu(), attention_mask.cpu().bool()  # one transfer, not one per passage
        keys = [ids[m].numpy().tobytes() for ids, m in zip(ids_cpu, mask_cpu)]
        first: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self._frozen:
                first.setdefault(k, i)
        new = list(first.values())
        if new:
            rows = torch.tensor(new, device=input_ids.device)
            ids, m = input_ids[rows], attention_mask[rows]
            real = m.bool().any(0)  # drop the columns that are padding in every row left
            emb = self.embed(ids[:, real], m[:, real], passages=True)
            for i, e in zip(new, emb):
                self._frozen[keys[i]] = e
        return torch.stack([self._frozen[k] for k in keys])


#: Encoders whose position embeddings reserve the first 2 positions (the padding index's offset).
_OFFSET_POSITIONS = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}


def max_input_tokens(config) -> int | None:
    """The longest input an encoder of ``config`` takes: its position embeddings less those RoBERTa-family
    models reserve (2 of RoBERTa's 514); None where the config sets no limit."""
    n = getattr(config, "max_position_embeddings", None)
    return None if n is None else n - _OFFSET_POSITIONS.get(config.model_type, 0)


def make_model(architecture: str, encoder: str | None = None, pretrained: bool = True, config=None,
               temperature: float | None = None, passage_grad: bool = True,
               attention_dropout: float | None = None, frozen_passages: bool = False,
               hidden_dropout: float | None = None) -> nn.Module:
    """The reranker model an architecture name stands for (``cross`` or ``bi``); ``temperature``,
    ``passage_grad`` and ``frozen_passages``: bi only."""
    if architecture == "bi":
        return BiEncoder(encoder, pretrained=pretrained, config=config, temperature=temperature,
                         passage_grad=passage_grad, attention_dropout=attention_dropout, hidden_dropout=hidden_dropout,
                         frozen_passages=frozen_passages)
    if frozen_passages:
        raise ValueError("frozen_passages=true is a bi-encoder setting: a cross-encoder reads prefix and passage "
                         "together (--model.frozen_passages false, or --model.architecture bi)")
    if not passage_grad:
        raise ValueError("passage_grad=false is a bi-encoder setting: a cross-encoder reads prefix and passage "
                         "together (--model.passage_grad true, or --model.architecture bi)")
    return CrossEncoder(encoder, pretrained=pretrained, config=config, attention_dropout=attention_dropout,
                        hidden_dropout=hidden_dropout)
