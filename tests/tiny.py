"""Small, real Hugging Face models and text built offline.

Tests, benchmarks and the demo cannot download from the hub, so they build what they need here:
a byte-level BPE tokenizer trained on local text, GPT-2 / RoBERTa configs of any size with random
weights, and WikiText-shaped articles (`` = Title = `` headings) of pseudo-English. Everything is
deterministic under its seed and is saved with ``save_pretrained`` so that the real loading code
(``AutoModel*.from_pretrained(path)``) is what reads it back.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterable

_SYLLABLES = ["ka", "lo", "mi", "ra", "ten", "vor", "sel", "an", "du", "pe", "ri", "sto", "gu", "fa", "ne", "bri"]
_COMMON = (
    "the of and in to was a is for on as by with from at that his it an were are which this "
    "be first also had after has new one two their its he she they city river year war album "
    "film team season during north south born played built called known state until between"
).split()


def wikitext_articles(n_articles: int = 20, paragraphs: int = 3, sentences: int = 6, seed: int = 0) -> str:
    """Pseudo-English text laid out like raw WikiText (`` = Title = `` headings, `` \\n`` blank lines).

    Each article repeats its own rare words, so BM25 has real signal to find the article again.
    """
    rng = random.Random(seed)
    out = [" \n"]
    for a in range(n_articles):
        name = "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()
        title = f"{name} {rng.choice(['River', 'Castle', 'Album', 'Station', 'Battle', 'Bridge'])}"
        topic = ["".join(rng.choice(_SYLLABLES) for _ in range(2)) for _ in range(5)]
        out += [f" = {title} = \n", " \n"]
        for _ in range(paragraphs):
            sents = []
            for _ in range(sentences):
                words = [rng.choice(_COMMON) if rng.random() < 0.7 else rng.choice(topic) for _ in range(rng.randint(6, 14))]
                words.insert(rng.randrange(len(words)), name)
                sents.append(" ".join(words).capitalize() + " .")
            out += [" " + " ".join(sents) + " \n", " \n"]
    return "".join(out)


def train_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 512, kind: str = "gpt2"):
    """Train a byte-level BPE tokenizer and save it as a Hugging Face fast tokenizer.

    ``kind="gpt2"`` gives a GPT-2 style tokenizer (``<|endoftext|>``); ``kind="roberta"`` adds the
    RoBERTa specials (``<s> </s> <pad> <unk> <mask>``) and post-processor.
    """
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast, RobertaTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>"] if kind == "gpt2" else ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(texts), vocab_size=vocab_size, min_frequency=1, special_tokens=specials)
    if kind == "gpt2":
        tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    elif kind == "roberta":
        from tokenizers.processors import RobertaProcessing

        bpe._tokenizer.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")),
                                                          ("<s>", bpe.token_to_id("<s>")))
        tok = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                   sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                                   mask_token="<mask>")
    else:
        raise ValueError(f"train_tokenizer: kind must be 'gpt2' or 'roberta', got {kind!r}")
    tok.model_max_length = 1_000_000  # the model config, not the tokenizer, bounds the length
    tok.save_pretrained(out_dir)
    return tok


def make_gpt2(out_dir: str | Path, tokenizer, n_layer: int = 2, n_embd: int = 32, n_head: int = 2,
              n_positions: int = 1024, seed: int = 0):
    """A randomly initialised GPT-2 (real architecture), saved with its tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model


def make_roberta(out_dir: str | Path, tokenizer, num_hidden_layers: int = 2, hidden_size: int = 32,
                 num_attention_heads: int = 2, max_position_embeddings: int = 514, seed: int = 0, **config):
    """A randomly initialised RoBERTa encoder (real architecture), saved with its tokenizer.

    ``config`` overrides further ``RobertaConfig`` fields (e.g. ``initializer_range``, dropouts).
    """
    import torch
    from transformers import AutoModel, RobertaConfig

    torch.manual_seed(seed)
    overrides = config
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                           num_attention_heads=num_attention_heads, intermediate_size=4 * hidden_size,
                           max_position_embeddings=max_position_embeddings, pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **overrides)
    model = AutoModel.from_config(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model
