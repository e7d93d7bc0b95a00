"""The reranker model: a plain ``nn.Module`` with no training logic (see :mod:`reranking.system`)."""

from __future__ import annotations

import torch
from torch import nn


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

    def __init__(self, encoder: str = "roberta-base", pretrained: bool = True, config=None):
        super().__init__()
        from transformers import AutoModel

        from ralm.models import load_config, resolve

        if config is None:
            config = load_config(encoder)
            r = resolve(encoder)
            self.encoder = (AutoModel.from_pretrained(r.path, **r.kwargs()) if pretrained
                            else AutoModel.from_config(config))
        else:
            self.encoder = AutoModel.from_config(config)
        # from_pretrained returns the model in eval mode, and Lightning keeps module modes as it finds
        # them: without this, fine-tuning a pretrained encoder would silently run with dropout off.
        self.encoder.train()
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler = None
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
