"""Pretrain the demo's reranker encoder on the world: a 3-layer RoBERTa that can compare names.

The paper fine-tunes RoBERTa-base, which arrives knowing how to match words across a pair. A
from-scratch encoder fine-tuned on the demo's ~2k LM-supervised examples never discovers that skill
(measured: val NLL of the chosen passage 6.8-7.0 against 6.2 for BM25's first hit), so the demo
pretrains one, as RoBERTa was pretrained before the paper used it:

* **Tokenizer**: word level, trained on the world's corpus and training text. Every invented name is
  one token wherever it appears (a byte-level BPE splits a title's first word differently at a line
  start than after a space, so a title could never match its mention).
* **Task**: contrastive, on pairs shaped exactly like the reranker's input (``<s> prefix tail
  </s></s> passage </s>``). The prefix is a cut of the world's *training* text; the positive is the
  corpus article of the person named last before the cut (:func:`demo.world.mentions`: distant
  supervision from the text alone, no LM scores). Stage 1 uses random other people as negatives
  (the matching skill appears after ~400 updates); stage 2 the near-duplicates a lexical retriever
  confuses: siblings, namesakes, towns named nearby and earlier people of the same prefix.
  ``--init-from`` continues from an earlier export (more hard-negative rounds).

The result is committed as ``demo/assets/encoder`` (0.9 MB), a reranker export (encoder and scoring
head); ``reranking.fit --model.init_from demo/assets/encoder`` then fine-tunes both with the paper's
LM-supervised loss. Its recipe (one stage-1 run, then three 3,000-update hard rounds, about an hour
on 1 thread) and per-round figures are in ``demo/assets/encoder/README.md``.

What mattered, measured as word ppl on 24 held-out evaluation articles of the demo world (BM25 4.574;
the demo's own 8 articles are too few to rank encoders: a couple of stride decisions move them by
0.04): hard-negative training length (4.721 / 4.623 / 4.542 / 4.520 after 3k / 6k / 9k / 12k
updates) and depth with wide heads (3 layers of 2 heads of 32 beat 2 layers of 4 heads of 16:
4.780 fine-tuned; 2 layers 128 wide learned far slower, 0.45 hard top-1 after 2,700 updates).
Cutting the prefix uniformly up to the next mention instead of near the last one: worse (4.635
against 4.542). Evaluation people must appear in the training text (``eval-people-in-train``):
without, the encoder preferred people it had seen as positives (word ppl 6.48, worse than none).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def word_tokenizer(texts: list[str], out_dir: Path):
    """A RoBERTa-style fast tokenizer over whole words (``Whitespace`` pre-tokenizer, pair template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=1))
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[(s, t.token_to_id(s)) for s in ("<s>", "</s>")])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                  cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    tok.model_max_length = 1_000_000
    tok.save_pretrained(out_dir)
    return tok


def pretraining_pairs(text: str, ms: list[tuple[int, str]], n: int, rng: random.Random):
    """``n`` (prefix, name) pairs: a cut of ``text`` and the person it named last (``ms``: its mentions)."""
    out = []
    while len(out) < n:
        i = rng.randrange(len(ms) - 1)
        end, name = ms[i]
        limit = min(ms[i + 1][0] - len(ms[i + 1][1]), end + 160)  # stay before the next mention
        cut = end + int(rng.random() ** 2 * max(limit - end, 0))
        sp = text.rfind(" ", end, cut + 1)
        cut = sp if sp > end else end
        out.append((text[max(0, cut - 400):cut], name))
    return out


def negatives(name: str, tail: str, hard: bool, k: int, rng: random.Random, people: list[str], towns: list[str],
              by_first: dict, by_sur: dict) -> list[str]:
    """``k - 1`` titles that are not ``name``: random people, or (``hard``) its near-duplicates first."""
    neg: list[str] = []
    if hard:
        first, sur = name.split(" ", 1)
        for pool, m in ((by_sur[sur], 3), (by_first[first], 2)):
            pool = [t for t in pool if t != name and t not in neg]
            neg += rng.sample(pool, min(m, len(pool)))
        near = [t for t in towns if t in tail]
        neg += near[:1] or [rng.choice(towns)]
        neg += [t for t in people if t != name and t not in neg and t in tail][:2]
    while len(neg) < k - 1:
        t = rng.choice(people)
        if t != name and t not in neg and (hard or t not in tail):
            neg.append(t)
    return neg[:k - 1]


def pretrain(model_dir: Path, world, stages: list[tuple[int, bool]], batch_size: int = 16, k: int = 8,
             max_length: int = 64, max_prefix_tokens: int = 24, lr: float = 1e-3, seed: int = 0,
             init_from: str | Path | None = None, log=print):
    """Contrastive pretraining of the encoder in ``model_dir``, saved back there as a reranker export.

    ``stages``: ``(updates, hard)`` per stage; the first stage runs at ``lr``, later ones at ``lr / 2``, and a
    stage of 0 updates is skipped. ``init_from``: a reranker export (encoder and head) to continue from
    instead of the fresh encoder in ``model_dir``.
    """
    import torch
    from transformers import AutoTokenizer

    from demo.world import mentions
    from reranking.export import export_model, load_reranker
    from reranking.inputs import InputFormat, encode_pairs
    from reranking.model import CrossEncoder

    torch.manual_seed(seed)
    rng = random.Random(seed + 1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = load_reranker(init_from)[0] if init_from else CrossEncoder(str(model_dir), pretrained=True)
    fmt = InputFormat(max_length, max_prefix_tokens)
    contents = {t: f"{t}\n{body}" for t, body in world.corpus}
    people = [p.name for p in world.people]
    names = set(people)
    towns = [t for t in contents if t not in names]  # the titles that are nobody's name
    by_first: dict[str, list[str]] = {}
    by_sur: dict[str, list[str]] = {}
    for p in world.people:
        by_first.setdefault(p.first, []).append(p.name)
        by_sur.setdefault(p.surname, []).append(p.name)
    text = world.train_text[:1_500_000]
    ms = mentions(text, people)  # found once, shared by the stages
    t0 = time.time()
    for stage, (steps, hard) in enumerate(stages, 1):
        if not steps:
            continue
        pairs = pretraining_pairs(text, ms, steps * batch_size, rng)
        opt = torch.optim.AdamW(model.parameters(), lr=lr if stage == 1 else lr / 2, weight_decay=0.01)
        warm = max(1, steps // 20)
        sch = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
        model.train()
        hits = n = 0
        for step in range(steps):
            prefixes, docs, targets = [], [], []
            for prefix, name in pairs[step * batch_size:(step + 1) * batch_size]:
                cands = [name] + negatives(name, prefix[-200:], hard, k, rng, people, towns, by_first, by_sur)
                rng.shuffle(cands)
                targets.append(cands.index(name))
                prefixes.append(prefix)
                docs += [contents[t] for t in cands]
            enc = encode_pairs(tok, prefixes, docs, fmt, pair_prefix=[i for i in range(len(prefixes)) for _ in range(k)])
            scores = model(enc["input_ids"], enc["attention_mask"]).view(len(prefixes), k)
            y = torch.tensor(targets)
            loss = torch.nn.functional.cross_entropy(scores, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sch.step()
            hits += int((scores.argmax(1) == y).sum())
            n += len(y)
            if (step + 1) % max(1, steps // 10) == 0:
                log(f"[encoder] stage {stage} ({'hard' if hard else 'random'} negatives) step {step + 1}/{steps} "
                    f"loss {loss.item():.3f} top-1 {hits / n:.2f} ({time.time() - t0:.0f}s)")
                hits = n = 0
    export_model(model, tok, fmt, str(model_dir), model_dir)  # encoder + head: fit starts from both


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m demo.encoder", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="demo/assets/encoder")
    ap.add_argument("--world-config", default="configs/demo/world.yaml", help="the world to pretrain on")
    ap.add_argument("--random-steps", type=int, default=1500, help="stage 1 updates (random negatives)")
    ap.add_argument("--hard-steps", type=int, default=1500, help="stage 2 updates (near-duplicate negatives)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-length", type=int, default=96, help="pair length (match configs/demo/fit.yaml)")
    ap.add_argument("--max-prefix-tokens", type=int, default=48, help="prefix tail (match configs/demo/fit.yaml)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-from", help="a reranker export to continue pretraining (its tokenizer and shape are "
                                        "kept; --layers/--hidden/--heads are ignored)")
    ap.add_argument("--threads", type=int, default=1, help="1 is fastest for this small model on CPU")
    a = ap.parse_args(argv)

    import torch

    from demo.world import corpus_wikitext, world_from_config
    from tests.tiny import make_roberta

    torch.set_num_threads(a.threads)
    t0 = time.time()
    out = Path(a.out)
    world = world_from_config(a.world_config)
    if a.init_from:
        if Path(a.init_from).resolve() != out.resolve():
            shutil.copytree(a.init_from, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("pretrain_args.json"))
    else:
        tok = word_tokenizer([corpus_wikitext(world.corpus), world.train_text], out)
        make_roberta(out, tok, num_hidden_layers=a.layers, hidden_size=a.hidden, num_attention_heads=a.heads,
                     seed=a.seed, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    pretrain(out, world, [(a.random_steps, False), (a.hard_steps, True)], max_length=a.max_length,
             max_prefix_tokens=a.max_prefix_tokens, lr=a.lr, seed=a.seed, init_from=a.init_from)
    (out / "pretrain_args.json").write_text(json.dumps(vars(a) | {"seconds": round(time.time() - t0)}, indent=1))
    print(f"saved to {out} ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    main()
