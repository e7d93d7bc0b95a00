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

import torch
from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer
from tokenizers.processors import RobertaProcessing, TemplateProcessing
from transformers import (
    AutoModel,
    BertConfig,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaTokenizerFast,
)

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
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>"] if kind == "gpt2" else ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(texts), vocab_size=vocab_size, min_frequency=1, special_tokens=specials)
    if kind == "gpt2":
        tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    elif kind == "roberta":
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
              n_positions: int = 1024, seed: int = 0, vocab_size: int | None = None):
    """A randomly initialised GPT-2 (real architecture), saved with its tokenizer.

    ``vocab_size``: the embedding rows (default: the tokenizer's); 50,257 gives GPT-2's real LM-head cost."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size or len(tokenizer), n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
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


def train_bos_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 512):
    """A byte-level BPE tokenizer that *adds* a BOS token (``<s>``) to every encoding, as Llama-2's does.

    Exercises the tokenization rules that differ from GPT-2's: the evaluation text is tokenized without
    special tokens, while documents are encoded with them (``tokenizer.encode``, as the reference does).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(texts), vocab_size=vocab_size, min_frequency=1, special_tokens=["<unk>", "<s>", "</s>"])
    bos = bpe.token_to_id("<s>")
    bpe._tokenizer.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="</s>")
    tok.model_max_length = 1_000_000
    tok.save_pretrained(out_dir)
    return tok


def make_llama(out_dir: str | Path, tokenizer, hidden_size: int = 32, num_hidden_layers: int = 2,
               num_attention_heads: int = 4, num_key_value_heads: int = 2, max_position_embeddings: int = 1024,
               seed: int = 0):
    """A randomly initialised Llama (grouped-query attention, RoPE, SiLU MLP), saved with its tokenizer."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model


def make_bert(out_dir: str | Path, texts: Iterable[str], vocab_size: int = 600, hidden_size: int = 32,
              num_hidden_layers: int = 2, num_attention_heads: int = 2, max_position_embeddings: int = 128, seed: int = 0):
    """A randomly initialised BERT encoder with a locally trained uncased WordPiece tokenizer
    (``[CLS] a [SEP] b [SEP]`` pairs with token type ids, as MiniLM's)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(list(texts), vocab_size=vocab_size, min_frequency=1)
    tok = BertTokenizerFast(tokenizer_object=wp._tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                            pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    tok.model_max_length = max_position_embeddings
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                        num_attention_heads=num_attention_heads, intermediate_size=4 * hidden_size,
                        max_position_embeddings=max_position_embeddings, pad_token_id=tok.pad_token_id)
    model = AutoModel.from_config(config)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return model
