"""Models and tokenizers loaded by any spelling :func:`ralm.models.resolve` takes, checked before weights load.

A model that is not a causal LM where one is needed, or a tokenizer whose ids exceed the model's vocabulary,
is refused with one line (:class:`~ralm.models.ModelError`) before any heavy work; the frozen LM is loaded in
eval mode with SDPA attention and a fused GELU (:func:`load_causal_lm`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES as MASKED

from ralm.models import ModelError, resolve
from ralm.scoring import resolve_device


def _from_pretrained_error(spec: str, what: str, e: Exception) -> ModelError:
    return ModelError(
        f"could not load the {what} of {spec!r}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}. "
        "Pass a short name (python -m ralm.models list; fetch it first), a local directory written by "
        "save_pretrained, a .gguf file, or a hub id (needs the network or a warm Hugging Face cache)")


def _auto_load(auto_class, spec: str, what: str):
    r = resolve(spec)
    try:
        return auto_class.from_pretrained(r.path, **r.kwargs())
    except (OSError, ValueError, KeyError) as e:
        raise _from_pretrained_error(str(spec), what, e) from e


def load_tokenizer(spec: str):
    """The fast tokenizer of a model spec."""
    return _auto_load(AutoTokenizer, spec, "tokenizer")


def load_config(spec: str):
    """The model config of a spec (cheap: no weights); for a reranker export, its encoder's config."""
    encoder = Path(resolve(spec).path) / "encoder_config.json"
    if encoder.is_file():  # reranking.export writes a config.json that transformers refuses, on purpose
        return AutoConfig.from_pretrained(str(encoder))
    return _auto_load(AutoConfig, spec, "config")


def check_causal_lm(spec: str, config, tokenizer, role: str = "--model") -> None:
    """Refuse, before any weights are loaded, a model that is not a causal LM or a tokenizer it cannot read.

    An encoder such as RoBERTa has a causal-LM class in transformers, but its weights were never trained
    left to right: scoring with it gives a complete-looking dataset of meaningless numbers.
    """
    mtype = getattr(config, "model_type", None)
    archs = list(getattr(config, "architectures", None) or [])
    causal_archs = set(CAUSAL.values()) | {n for v in CAUSAL.values() if isinstance(v, tuple) for n in v}
    if mtype not in CAUSAL or (archs and not any(a in causal_archs for a in archs)):
        raise ModelError(f"{role} {spec!r} is not a causal language model (model_type {mtype!r}, architectures "
                         f"{archs or 'unknown'}); the generator and zero-shot ranker must be left-to-right LMs "
                         "such as GPT-2 or SmolLM2 (an encoder belongs in --model.encoder of reranking.fit)")
    check_vocabulary(spec, config, tokenizer, role)


def check_vocabulary(spec: str, config, tokenizer, role: str = "--model") -> None:
    """The tokenizer's ids must all have an embedding row (else the forward fails deep inside, or worse)."""
    n_tok, n_emb = len(tokenizer), getattr(config, "vocab_size", None)
    if n_emb is not None and n_tok > n_emb:
        raise ModelError(f"{role} {spec!r}: its tokenizer has {n_tok:,} tokens but the model only {n_emb:,} "
                         "embedding rows, so ids beyond that would fail or read garbage. The tokenizer and the "
                         "weights do not belong together; save them from the same model")


#: Activations that are a hand-written tanh GELU, swapped for torch's fused one at load time.
_UNFUSED_GELU = {"gelu_new", "gelu_fast"}


def load_causal_lm(spec: str, device: str | None = None, role: str = "--model", device_map=None, max_memory=None,
                   offload_folder: str | None = None):
    """``(model, tokenizer)``: a frozen causal LM in eval mode with SDPA attention and a fused GELU,
    checked first.

    ``device_map`` (with ``max_memory`` and ``offload_folder``): a model larger than one device is placed
    layer by layer over GPUs, CPU and disk by Accelerate (``from_pretrained(device_map=...)``) and
    ``device`` is ignored; see :class:`ralm.settings.Scoring`.
    """
    tokenizer = load_tokenizer(spec)
    config = load_config(spec)
    check_causal_lm(spec, config, tokenizer, role)
    r = resolve(spec)
    extra = {}
    if getattr(config, "activation_function", None) in _UNFUSED_GELU:
        # GPT-2's gelu_new is ~8 separate element-wise ops costing 1.6x the matmul it follows; torch's
        # tanh GELU is the same function (max difference 4.8e-7) in one fused kernel, 3.6-4.7x faster.
        config.activation_function = "gelu_pytorch_tanh"
        extra["config"] = config
    if device_map is not None:
        extra.update(device_map=_device_keys(device_map), offload_folder=offload_folder,
                     max_memory=_device_keys(max_memory))
    try:
        model = AutoModelForCausalLM.from_pretrained(r.path, attn_implementation="sdpa", **extra, **r.kwargs())
    except pickle.UnpicklingError:  # torch's own message advises weights_only=False: never pass that on
        raise ModelError(f"could not load the weights of {str(spec)!r}: they are a pickle that holds more than tensors, "
                         "which is not read here (reading it runs code from the file). Convert it where it was "
                         "made (model.save_pretrained(DIR) writes safetensors) or use another copy") from None
    except (OSError, ValueError) as e:
        raise _from_pretrained_error(str(spec), "weights", e) from e
    model.eval().requires_grad_(False)
    return (model if device_map is not None else model.to(resolve_device(device))), tokenizer


def _device_keys(m):
    """GPU indices written as strings in YAML or on the command line ("0") as the ints Accelerate wants."""
    if not isinstance(m, dict):
        return m
    as_int = lambda v: int(v) if isinstance(v, str) and v.isdigit() else v  # noqa: E731
    return {as_int(k): as_int(v) for k, v in m.items()}


def check_encoder(spec: str, config, role: str = "--model.encoder") -> None:
    """Refuse a model that is not a bidirectional encoder (a causal LM reads left to right only, and has no
    padding token a batch of pairs needs), by name, before any weights load."""
    mtype = getattr(config, "model_type", None)
    if mtype in CAUSAL and mtype not in MASKED:
        raise ModelError(f"{role} {spec!r} is a causal language model (model_type {mtype!r}); a reranker's encoder "
                         "reads prefix and passage both ways: give a bidirectional encoder such as minilm-l6, "
                         "roberta-base or bert-base-uncased (a causal LM belongs in --model of data_gen or eval)")
