"""Self-describing reranker exports, and loading a reranker from an export or a Lightning checkpoint.

An export directory holds everything needed to score pairs, with no training config and no download:

- ``model.safetensors``: the model's weights (:class:`~reranking.model.CrossEncoder`: encoder + head;
  :class:`~reranking.model.BiEncoder`: encoder, and its frozen passage encoder where it has one);
- ``encoder_config.json``: the encoder's Hugging Face config;
- ``config.json``: a stub whose model type names this project, so that ``AutoModel``, ``SentenceTransformer`` and
  ``CrossEncoder`` refuse the directory, naming ``reranking.formats``, instead of loading the encoder with
  random weights (the weights are the reranker's, ``encoder.*`` and a head; the ecosystem's layouts are
  what ``python -m reranking.formats`` writes);
- ``README.md``: the model card (base encoder, data, loss, steps, the validation metrics at export, how to load);
- the tokenizer files (``tokenizer.json`` ...);
- ``reranker.json``: format/version, the encoder name it was trained from, the input format
  (:class:`~reranking.inputs.InputFormat`, whose ``architecture`` says which model class) and, for a
  bi-encoder, ``cosine_temperature`` and ``frozen_passages``.

A Lightning ``.ckpt`` written by :class:`~reranking.system.RerankerSystem` carries the same description
under its ``"reranker"`` key and is read with ``torch.load(weights_only=True)``: no code is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model
from transformers import AutoConfig, AutoTokenizer

from ralm.files import atomic_write
from ralm.settings import InputError
from reranking.inputs import InputFormat
from reranking.model import make_model

#: Key of the reranker's self-description (config, tokenizer files, input format) in every checkpoint.
CKPT_META_KEY = "reranker"

META_FILE = "reranker.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "ralm-reranker"
ENCODER_CONFIG = "encoder_config.json"
#: The model type of the stub config.json: transformers quotes it when it refuses the directory.
STUB_MODEL_TYPE = "ralm-reranker (load it with reranking.load, or convert it: python -m reranking.formats)"


def run_id(run_dir: str | Path) -> str:
    """A fit's identity in its export: a hash of its run directory (no path of the machine that trained)."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def check_export_dir(out_dir: str | Path, run: str) -> None:
    """Refuse to write over another fit's finished export: its ``reranker.json`` records the run directory of the
    fit that wrote it (the same fit, rerun or resumed, may write again; an export from before the record, too)."""
    meta = Path(out_dir) / META_FILE
    try:
        theirs = json.loads(meta.read_text()).get("trained", {}).get("run") if meta.is_file() else None
    except (ValueError, AttributeError):
        theirs = None
    if theirs and theirs != run:
        raise InputError(f"--export_dir {out_dir} holds the export of another fit (another run directory); pass "
                         f"another --export_dir, or delete {out_dir} to replace it")


def export(system, out_dir: str | Path, trained: dict | None = None) -> Path:
    """Write ``system`` (a :class:`~reranking.system.RerankerSystem`) as a self-describing directory;
    ``trained``: how it was trained (precision, steps, data, validation metrics), recorded as is."""
    h = system.hparams
    training = {"loss": h.loss, "optimizer": dict(h.optimizer), **(trained or {})}  # a 0-step export: as it started
    return export_model(system.model, system.tokenizer, system.fmt, h.encoder, out_dir, training)


def export_model(model, tokenizer, fmt, encoder: str, out_dir: str | Path, trained: dict | None = None) -> Path:
    """Write a reranker model, its tokenizer and input format as a self-describing directory; every file under a
    temporary name first, ``reranker.json`` (what marks an export complete) last."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / WEIGHTS_FILE, lambda t: save_model(model, str(t), metadata={"format": FORMAT}))
    atomic_write(out / ENCODER_CONFIG, lambda t: Path(t).write_text(model.config.to_json_string()))
    atomic_write(out / "config.json", lambda t: Path(t).write_text(json.dumps(
        {"model_type": STUB_MODEL_TYPE, "reranker": META_FILE, "encoder_config": ENCODER_CONFIG}, indent=2) + "\n"))
    with tempfile.TemporaryDirectory(dir=out, prefix=".tokenizer-") as tmp:
        tokenizer.save_pretrained(tmp)
        for f in sorted(Path(tmp).iterdir()):
            os.replace(f, out / f.name)
    meta = {"format": FORMAT, "version": 1, "encoder": Path(encoder).name if Path(encoder).exists() else encoder,
            "input_format": fmt.to_dict(), "weights": WEIGHTS_FILE, "encoder_config": ENCODER_CONFIG,
            "cosine_temperature": getattr(model, "temperature", None),
            "frozen_passages": getattr(model, "frozen_passages", False),
            "score": ("linear head on the first token's last hidden state" if fmt.architecture == "cross" else
                      f"cosine of mean-pooled prefix and passage embeddings / {getattr(model, 'temperature', None)} "
                      "(cosine_temperature)")
            + (f" + {fmt.bm25_weight} x BM25 score" if fmt.bm25_weight else "")
            + ("; every list also holds 'no passage' (the empty text, BM25's first score), which it may choose"
               if fmt.abstain else "")}
    if trained:
        meta["trained"] = trained
    atomic_write(out / "README.md", lambda t: Path(t).write_text(model_card(meta)))
    atomic_write(out / META_FILE, lambda t: Path(t).write_text(json.dumps(meta, indent=2) + "\n"))
    return out


def model_card(meta: dict) -> str:
    """The export's README.md: what it is, how it was trained, what it scored at export, how to load it."""
    t = meta.get("trained") or {}
    f = meta["input_format"]
    steps = t.get("fit_steps")
    state = ("the untrained start (0 steps)" if steps == 0 else
             f"trained {steps} steps (weights of step {t.get('steps')})" if steps is not None else "trained")
    val = t.get("validation") or {}
    lines = ["# A predictive reranker for In-Context RALM (ralm-rerank)", "",
             f"{meta['encoder']} as a {'cross-encoder' if f['architecture'] == 'cross' else 'bi-encoder'}, {state}, "
             "to choose the passage a frozen causal LM reads before its prefix.", "",
             "| | |", "|---|---|", f"| base encoder | {meta['encoder']} |", f"| score | {meta['score']} |",
             f"| reads | the prefix's last {f['max_prefix_tokens']} encoder tokens; "
             + (f"the passage's first {f['max_passage_tokens']}" if f["architecture"] == "bi" else
                f"the passage up to {f['max_length']} tokens a pair") +
             (f"; without {', '.join(map(repr, f['drop']))}" if f.get("drop") else "") + " |",
             *([f"| training data | {t['data']} |"] if t.get("data") else []),
             *([f"| loss | {t['loss']} |"] if t.get("loss") else []),
             *([f"| optimizer | {json.dumps(t['optimizer'])} |"] if t.get("optimizer") else []),
             *([f"| precision | {t['precision']} |"] if t.get("precision") else []),
             *(f"| {k} (validation at step {t.get('steps')}, the weights exported) | {v:.4f} |"
               for k, v in sorted(val.items())), "",
             "## Load it", "", "```python", "import reranking", 'r = reranking.load("THIS_DIRECTORY")',
             'scores, order = r.rank(prefix_text, ["Title\\npassage text", ...])', "```", "",
             "`python -m eval.ppl --reranker THIS_DIRECTORY` evaluates it; `python -m reranking.formats --reranker "
             "THIS_DIRECTORY --out DIR` writes it for sentence-transformers (bi-encoders) or CrossEncoder / "
             "transformers (cross-encoders). transformers and sentence-transformers refuse this directory itself "
             "(its config.json says why): its weights are the reranker's, not a bare encoder's.", ""]
    return "\n".join(lines)


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
        if not (path / "tokenizer_config.json").is_file() or not any(
                (path / f).is_file() for f in ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model")):
            raise InputError(f"{str(path)!r} lacks its tokenizer files (tokenizer_config.json and tokenizer.json "
                             "or a vocabulary): without them every word would be one unknown token. Copy the "
                             "export whole, or export the reranker again")
        weights = path / meta.get("weights", WEIGHTS_FILE)
        try:
            with safe_open(str(weights), "pt"):
                pass
        except Exception as e:  # noqa: BLE001 - truncated or corrupt: one message
            raise InputError(f"{weights} is not a readable safetensors file ({str(e).strip()[:80]}); it may be "
                             "truncated. Copy the export whole, or export the reranker again") from None
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
        enc = path / meta.get("encoder_config", ENCODER_CONFIG)
        if not enc.is_file() and "encoder_config" in meta:  # the stub config.json would get transformers' "upgrade"
            raise InputError(f"{str(path)!r} is an incomplete export: {enc.name} (its encoder's configuration) is "
                             "missing; copy the whole export directory, or export it again (reranking.fit)")
        config = AutoConfig.from_pretrained(str(enc) if enc.is_file() else path)  # exports before the stub: config.json
        model = make_model(fmt.architecture, config=config, temperature=meta.get("cosine_temperature"),
                           frozen_passages=meta.get("frozen_passages", False))
        load_model(model, str(path / meta.get("weights", WEIGHTS_FILE)), strict=True)
        tokenizer = AutoTokenizer.from_pretrained(path, config=config)  # not the stub config.json
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
