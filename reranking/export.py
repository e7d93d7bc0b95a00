"""Self-describing reranker exports, and loading a reranker from an export or a Lightning checkpoint.

An export directory holds everything needed to score pairs, with no training config and no download:

- ``model.safetensors``: the model's weights (:class:`~reranking.model.CrossEncoder`: encoder + head;
  :class:`~reranking.model.BiEncoder`: encoder, and its frozen passage encoder where it has one);
- ``config.json``: the encoder's Hugging Face config;
- the tokenizer files (``tokenizer.json`` ...);
- ``reranker.json``: format/version, the encoder name it was trained from, the input format
  (:class:`~reranking.inputs.InputFormat`, whose ``architecture`` says which model class) and, for a
  bi-encoder, ``cosine_temperature`` and ``frozen_passages``.

A Lightning ``.ckpt`` written by :class:`~reranking.system.RerankerSystem` carries the same description
under its ``"reranker"`` key and is read with ``torch.load(weights_only=True)``: no code is unpickled.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from transformers import AutoConfig, AutoTokenizer

from ralm.settings import InputError
from reranking.inputs import InputFormat
from reranking.model import make_model

#: Key of the reranker's self-description (config, tokenizer files, input format) in every checkpoint.
CKPT_META_KEY = "reranker"

META_FILE = "reranker.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "ralm-reranker"


def export(system, out_dir: str | Path, trained: dict | None = None) -> Path:
    """Write ``system`` (a :class:`~reranking.system.RerankerSystem`) as a self-describing directory;
    ``trained``: how it was trained (e.g. the resolved precision), recorded as is."""
    return export_model(system.model, system.tokenizer, system.fmt, system.hparams.encoder, out_dir, trained)


def export_model(model, tokenizer, fmt, encoder: str, out_dir: str | Path, trained: dict | None = None) -> Path:
    """Write a reranker model, its tokenizer and input format as a self-describing directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_model(model, str(out / WEIGHTS_FILE), metadata={"format": FORMAT})
    model.config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {"format": FORMAT, "version": 1, "encoder": encoder,
            "input_format": fmt.to_dict(), "weights": WEIGHTS_FILE,
            "cosine_temperature": getattr(model, "temperature", None),
            "frozen_passages": getattr(model, "frozen_passages", False),
            "score": ("linear head on the first token's last hidden state" if fmt.architecture == "cross" else
                      "cosine of mean-pooled prefix and passage embeddings / cosine_temperature")
            + (f" + {fmt.bm25_weight} x BM25 score" if fmt.bm25_weight else "")}
    if trained:
        meta["trained"] = trained
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return out


def checkpoint_meta(system) -> dict:
    """What a checkpoint needs to rebuild ``system``'s reranker with no training config and no download
    (stored under :data:`CKPT_META_KEY`; :func:`load_reranker` reads it back)."""
    with tempfile.TemporaryDirectory() as tmp:
        system.tokenizer.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    return {"format": FORMAT, "version": 1, "encoder": system.hparams.encoder,
            "encoder_config": system.model.config.to_json_string(), "input_format": system.fmt.to_dict(),
            "tokenizer_files": files, "cosine_temperature": getattr(system.model, "temperature", None),
            "frozen_passages": getattr(system.model, "frozen_passages", False)}


def read_checkpoint(path: Path, flag: str = "") -> dict:
    """A reranking.fit checkpoint's dict, read without unpickling code (``weights_only``); a truncated,
    corrupt or foreign file is one :class:`InputError` naming ``flag`` and the path."""
    name = f"{flag} {str(path)!r}".strip()
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated, corrupt or foreign: one message
        raise InputError(f"{name} is not a readable checkpoint ({type(e).__name__}); it may be truncated or not a "
                         "torch file. Use another one (checkpoints/best-*.ckpt, an earlier last.ckpt, or an "
                         "export directory)") from None
    if not isinstance(ckpt, dict) or ckpt.get(CKPT_META_KEY) is None or "state_dict" not in ckpt:
        raise InputError(f"{name} is not a checkpoint of reranking.fit (no {CKPT_META_KEY!r} description); "
                         "train or export one with `python -m reranking.fit`")
    return ckpt


def check_reranker(path: str | Path) -> None:
    """Cheap checks that ``path`` is a reranker export or a reranking.fit checkpoint (before heavy work)."""
    path = Path(path)
    if path.is_dir():
        if not (path / META_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
            have = sorted(p.name for p in path.iterdir())[:20]
            raise InputError(
                f"{str(path)!r} is not a reranker export (needs {META_FILE} and {WEIGHTS_FILE}; has {have}); "
                "pass a directory written by reranking.export.export / `python -m reranking.fit`, or a .ckpt")
        try:
            meta = json.loads((path / META_FILE).read_text())
        except ValueError:
            raise InputError(f"{path / META_FILE} is not valid JSON; export the reranker again") from None
        if meta.get("format") != FORMAT:
            raise InputError(f"{path / META_FILE}: format {meta.get('format')!r}, expected {FORMAT!r}")
    elif path.is_file():
        read_checkpoint(path)
    else:
        raise InputError(f"reranker {str(path)!r} does not exist")


def load_reranker(path: str | Path, device: str | torch.device = "cpu"):
    """Load ``(model, tokenizer, InputFormat)`` from an export directory or a Lightning ``.ckpt``.

    The model is returned in eval mode on ``device``.
    """
    path = Path(path)
    check_reranker(path)
    if path.is_dir():
        meta = json.loads((path / META_FILE).read_text())
        fmt = InputFormat.from_dict(meta["input_format"])
        model = make_model(fmt.architecture, config=AutoConfig.from_pretrained(path), temperature=meta.get("cosine_temperature"),
                           frozen_passages=meta.get("frozen_passages", False))
        load_model(model, str(path / meta.get("weights", WEIGHTS_FILE)), strict=True)
        tokenizer = AutoTokenizer.from_pretrained(path)
    elif path.is_file():
        ckpt = read_checkpoint(path)
        meta = ckpt[CKPT_META_KEY]
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in meta["tokenizer_files"].items():
                (Path(tmp) / name).write_bytes(data if isinstance(data, bytes) else str(data).encode())
            (Path(tmp) / "config.json").write_text(meta["encoder_config"])
            config = AutoConfig.from_pretrained(tmp)
            tokenizer = AutoTokenizer.from_pretrained(tmp)
        fmt = InputFormat.from_dict(meta["input_format"])
        model = make_model(fmt.architecture, config=config, temperature=meta.get("cosine_temperature"),
                           frozen_passages=meta.get("frozen_passages", False))
        state = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
        model.load_state_dict(state, strict=True)
    else:
        raise FileNotFoundError(f"reranker {str(path)!r} does not exist; pass an export directory or a .ckpt file")
    return model.to(device).eval(), tokenizer, fmt
