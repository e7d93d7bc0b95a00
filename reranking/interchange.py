"""A trained reranker written in the formats the ecosystem loads (sentence-transformers, transformers), with
what those formats cannot hold recorded beside it: the work of ``python -m reranking.formats``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_model

from ralm.settings import InputError
from reranking.export import META_FILE, load_reranker

#: The converted cross-encoder's model type: not one transformers knows, so that a stock class (loaded without
#: ``trust_remote_code``) refuses the directory, quoting this, instead of loading the encoder with a random head.
CROSS_MODEL_TYPE = "ralm-cross-encoder (load it with trust_remote_code=True)"

#: The cross-encoder's configuration and modeling code, written into the export for ``trust_remote_code``.
CROSS_MODELING = '''"""The ralm cross-encoder (encoder + linear head on the first token) as a sequence classifier. Its
config holds the base encoder's under ``encoder``; the model type is one no stock class takes, so that loading
without trust_remote_code=True is refused rather than answered with a random classification head. Its tokenizer
does not truncate: the model cuts each (prefix, passage) pair itself, as the reranker was trained (``ralm_cut``)."""
import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput


class RalmCrossEncoderConfig(PretrainedConfig):
    model_type = "MODEL_TYPE"

    def __init__(self, encoder=None, **kwargs):
        super().__init__(**kwargs)
        self.encoder = dict(encoder or {})
        self.hidden_size = self.encoder.get("hidden_size")


class RalmCrossEncoderForSequenceClassification(PreTrainedModel):
    config_class = RalmCrossEncoderConfig
    base_model_prefix = "encoder"

    def __init__(self, config):
        super().__init__(config)
        base = AutoConfig.for_model(**config.encoder)
        self.encoder = AutoModel.from_config(base, add_pooling_layer=False)
        self.head = torch.nn.Linear(base.hidden_size, 1)
        self.post_init()

    def cut(self, input_ids, attention_mask):
        """Pairs tokenized whole, cut as the reranker was trained: the prefix's last max_prefix_tokens tokens,
        then the passage's first tokens up to max_length (a tokenizer's truncation cuts pairs otherwise)."""
        c = self.config.ralm_cut
        head, mid, tail = c["head"], c["middle"], c["tail"]
        rows, types = [], []
        for ids, keep in zip(input_ids.tolist(), attention_mask.tolist()):
            seq = [i for i, k in zip(ids, keep) if k]
            body = seq[len(head):len(seq) - len(tail)]
            j = next((j for j in range(len(body)) if body[j:j + len(mid)] == mid), len(body))
            a = body[:j][-c["max_prefix_tokens"]:]
            b = body[j + len(mid):][:max(c["max_length"] - len(head) - len(mid) - len(tail) - len(a), 0)]
            rows.append(head + a + mid + b + tail)
            types.append(c["head_types"] + [c["prefix_type"]] * len(a) + c["middle_types"] + [c["passage_type"]] * len(b)
                         + c["tail_types"])
        width = max(map(len, rows))
        pad = lambda xs, v: torch.tensor([x + [v] * (width - len(x)) for x in xs], device=input_ids.device)  # noqa
        return pad(rows, c["pad_id"]), pad([[1] * len(r) for r in rows], 0), pad(types, 0)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        input_ids, attention_mask, types = self.cut(input_ids, attention_mask)
        extra = {"token_type_ids": types} if token_type_ids is not None else {}
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        return SequenceClassifierOutput(logits=self.head(hidden[:, 0]).float())
'''.replace("MODEL_TYPE", CROSS_MODEL_TYPE)


def _notes(meta: dict, fmt, kind: str) -> dict:
    return {"converted_from": Path(str(meta.get("encoder"))).name, "format": kind, "architecture": fmt.architecture,
            "bm25_weight": fmt.bm25_weight, "cosine_temperature": meta.get("cosine_temperature"),
            "max_prefix_tokens": fmt.max_prefix_tokens, "prefix_truncation": "keep the last tokens",
            "drop": list(fmt.drop), "abstain": fmt.abstain, "score": meta.get("score")}


def _sentence_transformer(encoder, tokenizer, max_tokens: int, side: str, out: Path) -> None:
    """One tower as a sentence-transformers directory (Transformer, mean Pooling, Normalize) that cuts its input
    as the project does: to ``max_tokens`` encoder tokens, specials included, from the ``side`` given."""
    out.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["truncation_side"] = side  # read back by AutoTokenizer, used by sentence-transformers' truncation
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_tokens, "do_lower_case": False},
                                                              indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": encoder.config.hidden_size, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "include_prompt": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (out / "2_Normalize").mkdir(exist_ok=True)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))


def to_sentence_transformers(model, tokenizer, fmt, out: Path) -> None:
    """A bi-encoder as two sentence-transformers directories: ``out`` embeds prefixes (their last
    ``max_prefix_tokens`` encoder tokens, as the project cuts them), ``out/passages`` passages (their first
    ``max_passage_tokens``; the passage tower: the frozen starting encoder of a query-side fit)."""
    _sentence_transformer(model.encoder, tokenizer, fmt.max_prefix_tokens, "left", out)
    passages = model.passage_encoder if getattr(model, "passage_encoder", None) is not None else model.encoder
    _sentence_transformer(passages, tokenizer, fmt.max_passage_tokens, "right", out / "passages")


def to_cross_encoder(model, tokenizer, fmt, out: Path) -> None:
    """A cross-encoder as a one-label sequence-classification directory with its configuration and modeling
    code: loaded with ``trust_remote_code=True`` it is the reranker; without, every stock class refuses it."""
    base = model.config.to_dict()
    base.pop("id2label", None), base.pop("label2id", None)
    config = {"model_type": CROSS_MODEL_TYPE, "encoder": base, "hidden_size": base.get("hidden_size"), "num_labels": 1,
              "architectures": ["RalmCrossEncoderForSequenceClassification"],
              "auto_map": {"AutoConfig": "modeling_ralm_cross.RalmCrossEncoderConfig",
                           "AutoModelForSequenceClassification":
                           "modeling_ralm_cross.RalmCrossEncoderForSequenceClassification"},
              "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity", "version": "ralm"},
              "max_length": fmt.max_length, "ralm_cut": pair_template(tokenizer) | {
                  "max_length": fmt.max_length, "max_prefix_tokens": fmt.max_prefix_tokens}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "modeling_ralm_cross.py").write_text(CROSS_MODELING)
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.model_max_length = UNCUT  # the model cuts each pair (prefix end, passage start), not the tokenizer
    tokenizer.save_pretrained(out)


#: The converted cross-encoder's tokenizer length: no truncation before the model's own cut.
UNCUT = 1_000_000


def pair_template(tokenizer) -> dict:
    """The special tokens the tokenizer puts around and between a pair (and their token types), found by
    tokenizing one: what the converted model needs to take a pair apart and cut it."""
    a, b = (tokenizer(x, add_special_tokens=False)["input_ids"] for x in ("alpha", "omega"))
    enc = tokenizer("alpha", "omega", return_token_type_ids=True)
    ids, types = enc["input_ids"], enc.get("token_type_ids") or [0] * len(enc["input_ids"])
    i = next(i for i in range(len(ids)) if ids[i:i + len(a)] == a)
    j = next(j for j in range(i + len(a), len(ids)) if ids[j:j + len(b)] == b)
    return {"head": ids[:i], "middle": ids[i + len(a):j], "tail": ids[j + len(b):], "head_types": types[:i],
            "middle_types": types[i + len(a):j], "tail_types": types[j + len(b):], "prefix_type": types[i],
            "passage_type": types[j], "pad_id": tokenizer.pad_token_id or 0}


def convert(reranker: str, out: str) -> str:
    """Write ``reranker`` (an export or a .ckpt) in its ecosystem's format into ``out``; returns how to use it."""
    dest = Path(out)
    if dest.exists() and not dest.is_dir():
        raise InputError(f"--out {out!r} is a file; pass a new directory for the converted reranker")
    if dest.exists() and any(dest.iterdir()):
        raise InputError(f"--out {out!r} exists and is not empty; pass a new directory")
    model, tokenizer, fmt = load_reranker(reranker)
    src = Path(reranker)
    meta = json.loads((src / META_FILE).read_text()) if src.is_dir() else {"encoder": str(src)}
    meta.setdefault("cosine_temperature", getattr(model, "temperature", None))
    tmp = dest.with_name(dest.name + ".tmp")
    kind = "sentence-transformers" if fmt.architecture == "bi" else "cross-encoder (trust_remote_code)"
    notes = _notes(meta, fmt, kind)
    lines = _usage(fmt, notes)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (to_sentence_transformers if fmt.architecture == "bi" else to_cross_encoder)(model, tokenizer, fmt, tmp)
        (tmp / "ralm_reranker.json").write_text(json.dumps(notes, indent=2) + "\n")
        (tmp / "README.md").write_text(
            f"# A ralm-rerank reranker ({kind})\n\nAn LM-supervised passage reranker for in-context retrieval-"
            f"augmented language modeling, converted by `python -m reranking.formats` from a reranking.fit export "
            f"(base encoder: {Path(str(meta.get('encoder'))).name}). How to score with it as the project does:\n\n"
            "```\n" + "\n".join(lines) + "\n```\n\nEvery setting it was trained with is in `ralm_reranker.json`.\n")
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
    except OSError as e:  # a full disk, a read-only folder, --out a file: one line, nothing half-written left
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"--out {out!r}: could not write the converted reranker ({e.strerror or e}); free some "
                         "space or pass a folder you can write to") from None
    return "\n".join([f"{reranker} -> {out}: {kind}", *lines])


def _usage(fmt, notes: dict) -> list[str]:
    """How to score with a converted reranker as the project does, line by line."""
    lines = []
    if fmt.architecture == "bi":
        lines.append(f"  score = cos(SentenceTransformer(out).encode(prefix), SentenceTransformer(out/passages)"
                     f".encode(passage)) / {notes['cosine_temperature']} (each cuts its text as the project does)")
    else:
        lines.append("  score = CrossEncoder(out, trust_remote_code=True).predict([(prefix, passage)])")
    if fmt.bm25_weight:
        lines.append(f"  + {fmt.bm25_weight} x the passage's BM25 score (a prior the format cannot hold)")
    if fmt.abstain:
        lines.append("  no passage: score the empty passage \"\" too (with the first passage's BM25 score); where it "
                     "scores highest, the reranker would take none")
    if fmt.architecture == "cross":
        lines.append(f"  prefixes and passages as they are: the model cuts each pair as the project does (the prefix's "
                     f"last {fmt.max_prefix_tokens} tokens, then the passage's start up to {fmt.max_length})")
    if fmt.drop:
        lines.append(f"  remove {', '.join(map(repr, fmt.drop))} from prefixes and passages first (trained blind to them)")
    return lines
