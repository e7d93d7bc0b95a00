"""A trained reranker written in the formats the ecosystem loads (sentence-transformers, transformers), with
what those formats cannot hold recorded beside it: the work of ``python -m reranking.formats``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_model

from ralm.settings import InputError
from reranking.export import META_FILE, load_reranker

#: The cross-encoder's modeling code, written into the export for ``trust_remote_code``.
CROSS_MODELING = '''"""The ralm cross-encoder (encoder + linear head on the first token) as a sequence classifier."""
import torch
from transformers import AutoConfig, AutoModel, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput


class RalmCrossEncoderForSequenceClassification(PreTrainedModel):
    base_model_prefix = "encoder"

    def __init__(self, config):
        super().__init__(config)
        self.encoder = AutoModel.from_config(config, add_pooling_layer=False)
        self.head = torch.nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        return SequenceClassifierOutput(logits=self.head(hidden[:, 0]).float())
'''


def _notes(meta: dict, fmt, kind: str) -> dict:
    return {"converted_from": meta.get("encoder"), "format": kind, "architecture": fmt.architecture,
            "bm25_weight": fmt.bm25_weight, "cosine_temperature": meta.get("cosine_temperature"),
            "max_prefix_tokens": fmt.max_prefix_tokens, "prefix_truncation": "keep the last tokens",
            "drop": list(fmt.drop), "abstain": fmt.abstain, "score": meta.get("score")}


def to_sentence_transformers(model, tokenizer, fmt, out: Path) -> None:
    """A bi-encoder as a sentence-transformers directory: Transformer (the encoder), mean Pooling, Normalize."""
    model.encoder.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max(fmt.max_prefix_tokens, fmt.max_passage_tokens), "do_lower_case": False}, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": model.config.hidden_size, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "include_prompt": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (out / "2_Normalize").mkdir(exist_ok=True)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))


def to_cross_encoder(model, tokenizer, fmt, out: Path) -> None:
    """A cross-encoder as a one-label sequence-classification directory with its modeling code."""
    config = model.config.to_dict()
    config.update(num_labels=1, architectures=["RalmCrossEncoderForSequenceClassification"],
                  auto_map={"AutoModelForSequenceClassification":
                            "modeling_ralm_cross.RalmCrossEncoderForSequenceClassification"},
                  sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity", "version": "ralm"},
                  max_length=fmt.max_length)
    config.pop("id2label", None), config.pop("label2id", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "modeling_ralm_cross.py").write_text(CROSS_MODELING)
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.model_max_length = fmt.max_length
    tokenizer.save_pretrained(out)


def convert(reranker: str, out: str) -> str:
    """Write ``reranker`` (an export or a .ckpt) in its ecosystem's format into ``out``; returns how to use it."""
    dest = Path(out)
    if dest.exists() and any(dest.iterdir()):
        raise InputError(f"--out {out!r} exists and is not empty; pass a new directory")
    model, tokenizer, fmt = load_reranker(reranker)
    src = Path(reranker)
    meta = json.loads((src / META_FILE).read_text()) if src.is_dir() else {"encoder": str(src)}
    meta.setdefault("cosine_temperature", getattr(model, "temperature", None))
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    kind = "sentence-transformers" if fmt.architecture == "bi" else "cross-encoder (trust_remote_code)"
    (to_sentence_transformers if fmt.architecture == "bi" else to_cross_encoder)(model, tokenizer, fmt, tmp)
    notes = _notes(meta, fmt, kind)
    (tmp / "ralm_reranker.json").write_text(json.dumps(notes, indent=2) + "\n")
    if dest.exists():
        dest.rmdir()
    tmp.rename(dest)
    lines = [f"{reranker} -> {out}: {kind}"]
    if fmt.architecture == "bi":
        lines.append(f"  score = cos(SentenceTransformer(out).encode(prefix), ...encode(passage)) / "
                     f"{notes['cosine_temperature']}")
    else:
        lines.append("  score = CrossEncoder(out, trust_remote_code=True).predict([(prefix, passage)])")
    if fmt.bm25_weight:
        lines.append(f"  + {fmt.bm25_weight} x the passage's BM25 score (a prior the format cannot hold)")
    if fmt.abstain:
        lines.append("  no passage: score the empty passage \"\" too (with the first passage's BM25 score); where it "
                     "scores highest, the reranker would take none")
    lines.append(f"  prefixes: pass their last {fmt.max_prefix_tokens} encoder tokens (the project keeps the end)")
    if fmt.drop:
        lines.append(f"  remove {', '.join(map(repr, fmt.drop))} from prefixes and passages first (trained blind to them)")
    return "\n".join(lines)
