"""What the benchmarks share: the text and tokenizer they run on, and the GPUs' data-sheet bf16 peaks."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"

# Dense bf16 tensor-core peaks from the data sheets (TFLOP/s); matched against the device name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0,
                    "4090": 165.0, "V100": 125.0}


def bf16_peak(device_name: str) -> float | None:
    """The data-sheet bf16 peak (TFLOP/s) of a GPU named ``device_name``, or None if not listed."""
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


def load_text_and_tokenizer(tmp: Path):
    """``(text, tokenizer, text source, tokenizer source)``: WikiText-2 test and the GPT-2 tokenizer from
    ../shared/data when present, else pseudo-WikiText and a 2,000-token BPE trained on it under ``tmp``."""
    from transformers import GPT2TokenizerFast

    from ralm.tiny import train_tokenizer, wikitext_articles

    raw = SHARED / "wikitext-2-raw" / "wiki.test.raw"
    text = raw.read_text(encoding="utf-8") if raw.exists() else wikitext_articles(n_articles=200, seed=0)
    if (SHARED / "gpt2-tokenizer" / "vocab.json").exists():
        from tokenizers import ByteLevelBPETokenizer

        bpe = ByteLevelBPETokenizer(str(SHARED / "gpt2-tokenizer" / "vocab.json"),
                                    str(SHARED / "gpt2-tokenizer" / "merges.txt"))
        tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                eos_token="<|endoftext|>", unk_token="<|endoftext|>")
        src = "GPT-2 tokenizer (shared)"
    else:
        tok = train_tokenizer([text], tmp / "tok", vocab_size=2000, kind="gpt2")
        src = "locally trained BPE (2,000) in a 50,257-row model"
    return text, tok, ("WikiText-2 test" if raw.exists() else "pseudo-WikiText"), src
