"""Train the demo's small GPT-2 on the synthetic world so that it reads its context.

The LM sees sequences shaped like the evaluation's conditioning (METHOD §2.4): ``[passage ; text]``
of exactly ``--ctx`` tokens, the passage (``title + "\\n" + text``, cut to ``--doc_budget`` tokens)
followed with no separator by a window of event-article text cut from the left. The passage is

* with probability ``p_right`` the corpus article of the person mentioned last in the window (the
  one the upcoming tokens are about),
* with probability ``p_wrong`` a near-duplicate: a sibling (same surname), a namesake (same first
  name), the town's list of residents, or an earlier person of the same window,
* otherwise nothing (a plain window of text, the ``none`` condition).

The loss is the LM loss on the text tokens only. Because a window mentions several people and the
passage is about at most one of them, the model learns to copy facts only for the person the passage
is about. Training text comes from many *fresh* worlds (``make_world(seed=1000 + i)``), never from the
demo's own world (seed 0), so no fact can be memorised: only copying from the passage helps.

Reproduce the committed weights (601 updates of a 1,500-step cosine schedule, batch 32 x 256 tokens;
about 6 minutes on 2 idle CPU cores, 12 on a busy machine)::

    python -m demo.train_lm --out demo/assets/lm

(the defaults are the committed run's settings; ``--stop_after 0`` runs the whole schedule). Windows
end, with probability ``--p_segment_end``, just before the next person is named, so that the facts
the passage can give fall inside the window: without that the copying signal is a few percent of
the tokens and a CPU-sized run does not learn to read its passage.

Everything (tokenizer, initialisation, data order) is a function of ``--seed``; bit-for-bit equality
also needs the same torch version and thread count.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from demo.world import corpus_wikitext, make_world

WORLD_SEED_BASE = 1000


def build_tokenizer(out_dir: Path, vocab_size: int, seed: int):
    """Byte-level BPE trained on the demo world (seed 0) and a few other worlds (syllable-level merges)."""
    from ralm.tiny import train_tokenizer

    texts = []
    for s in [0] + [WORLD_SEED_BASE + seed * 100 + i for i in range(8)]:
        w = make_world(seed=s, n_train_articles=150)
        texts += [corpus_wikitext(w.corpus), w.train_text, w.eval_text]
    return train_tokenizer(texts, out_dir, vocab_size=vocab_size, kind="gpt2")


class WorldStream:
    """One world's training text as token ids, with who is mentioned where, and its passages as ids."""

    def __init__(self, world_seed: int, tok, n_articles: int, doc_budget: int, p_segment_end: float = 0.0):
        self.p_segment_end = p_segment_end
        w = make_world(seed=world_seed, n_train_articles=n_articles, n_eval_articles=1)
        self.people = {p.name: p for p in w.people if p.split == "train"}
        all_people = {p.name: p for p in w.people}
        text = w.train_text
        enc = tok(text, return_offsets_mapping=True)
        self.ids = enc["input_ids"]
        ends = [e for _, e in enc["offset_mapping"]]
        names = sorted(self.people, key=len, reverse=True)
        rx = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
        # token index at which each full-name mention is complete, and who it is
        self.mention_pos, self.mention_name = [], []
        for m in rx.finditer(text):
            self.mention_pos.append(bisect.bisect_left(ends, m.end()))
            self.mention_name.append(m.group(1))
        self.docs = {}
        for title, body in w.corpus:
            self.docs[title] = tok(f"{title}\n{body}")["input_ids"][:doc_budget]
        self.by_first, self.by_town = {}, {}
        for p in all_people.values():
            self.by_first.setdefault(p.first, []).append(p.name)
        self.all_people = all_people

    def sample(self, rng: random.Random, ctx: int, p_right: float, p_wrong: float) -> tuple[list[int], int]:
        """One training sequence of exactly ``ctx`` tokens and the number of leading passage tokens."""
        u = rng.random()
        doc: list[int] = []
        end = rng.randrange(ctx, len(self.ids))
        if rng.random() < self.p_segment_end:
            # end the window where a person's segment ends (just before the next person is named), so
            # that all the facts the passage can give are inside the window: a denser copying signal
            j = rng.randrange(len(self.mention_pos) - 1)
            e = self.mention_pos[j + 1] - rng.randint(4, 12)
            if e > self.mention_pos[j] and e >= ctx:
                end = e
        if u < p_right + p_wrong:
            # the window's text ends at `end` (exclusive); the last full-name mention before it
            j = bisect.bisect_left(self.mention_pos, end) - 1
            if j >= 0:
                cur = self.all_people[self.mention_name[j]]
                if u < p_right:
                    doc = self.docs[cur.name]
                else:
                    choices = list(cur.siblings) + [n for n in self.by_first[cur.first] if n != cur.name]
                    choices += [cur.town] * 2
                    earlier = [self.mention_name[i] for i in range(max(0, j - 6), j) if self.mention_name[i] != cur.name]
                    choices += earlier
                    doc = self.docs[rng.choice(choices)]
        n_text = ctx - len(doc)
        return doc + self.ids[end - n_text:end], len(doc)


def train_lm(out: str = "demo/assets/lm", seed: int = 0, vocab: int = 1024, layers: int = 4, width: int = 128,
             heads: int = 4, ctx: int = 256, doc_budget: int = 96, steps: int = 1500, batch: int = 32,
             lr: float = 3e-3, warmup: int = 50, worlds: int = 24, articles_per_world: int = 300,
             p_right: float = 0.7, p_wrong: float = 0.2, threads: int = 2, p_segment_end: float = 0.8,
             init_from: str | None = None, world_offset: int = 0, stop_after: int = 601, save_every: int = 100,
             fp16: bool = False) -> None:
    """Train the demo LM (see the module docstring).

    Args:
        out: Output directory (weights, tokenizer, train_args.json).
        seed: Seed of the tokenizer, the initial weights and the sampling.
        vocab: Tokenizer vocabulary size.
        layers: Transformer layers.
        width: Hidden size.
        heads: Attention heads.
        ctx: Context length in tokens.
        doc_budget: Tokens of a passage placed before the text.
        steps: Length of the cosine schedule.
        batch: Windows per update.
        lr: Peak learning rate.
        warmup: Warmup updates.
        worlds: Number of fresh training worlds.
        articles_per_world: Articles written per training world.
        p_right: Probability that a window's passage is the right person's.
        p_wrong: Probability that it is a near-duplicate (else no passage).
        threads: torch threads.
        p_segment_end: Probability that a window ends at the end of a person's segment (denser copying signal).
        init_from: Continue training this saved model (stage 2).
        world_offset: Use training worlds from this index on.
        stop_after: Stop after this many updates, keeping the --steps schedule (0: run all).
        save_every: Save the weights every this many updates.
        fp16: Save fp16 weights (halves the file).
    """
    a = SimpleNamespace(**locals())  # the settings, as recorded in train_args.json
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if a.init_from:  # stage 2: continue from a stage-1 model (its tokenizer is kept)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.init_from)
        tok.save_pretrained(out)
    else:
        tok = build_tokenizer(out, a.vocab, a.seed)
    print(f"tokenizer: {len(tok)} tokens ({time.time() - t0:.0f}s)", flush=True)
    streams = [WorldStream(WORLD_SEED_BASE + a.seed * 100 + a.world_offset + i, tok, a.articles_per_world,
                           a.doc_budget, a.p_segment_end) for i in range(a.worlds)]
    print(f"{len(streams)} worlds, {sum(len(s.ids) for s in streams)} text tokens ({time.time() - t0:.0f}s)", flush=True)

    torch.manual_seed(a.seed)
    config = GPT2Config(vocab_size=len(tok), n_positions=a.ctx, n_embd=a.width, n_layer=a.layers, n_head=a.heads,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel.from_pretrained(a.init_from) if a.init_from else GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {a.layers} layers x {a.width}, {n_params / 1e6:.2f}M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / a.warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / a.steps))))
    rng = random.Random(a.seed)
    model.train()
    ema = None
    for step in range(a.steps):
        rows, labels = [], []
        for _ in range(a.batch):
            seq, n_doc = rng.choice(streams).sample(rng, a.ctx, a.p_right, a.p_wrong)
            rows.append(seq)
            labels.append([-100] * (n_doc + 1) + seq[n_doc + 1:])  # no loss on the passage or the first text token
        x = torch.tensor(rows)
        y = torch.tensor(labels)
        loss = model(input_ids=x, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 25 == 0 or step == a.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  ema {ema:.3f}  lr {sched.get_last_lr()[0]:.2e}  "
                  f"{time.time() - t0:.0f}s", flush=True)
        if a.save_every and step and step % a.save_every == 0:  # a usable intermediate checkpoint
            model.save_pretrained(out, safe_serialization=True)
        if a.stop_after and step + 1 >= a.stop_after:  # same schedule, stop early (reproduces a checkpoint)
            print(f"stopping after {step + 1} updates (schedule of {a.steps} steps)", flush=True)
            break
    model.eval()
    if a.fp16:
        model = model.half()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "train_args.json").write_text(json.dumps(vars(a) | {"n_params": n_params,
                                                                "train_seconds": round(time.time() - t0)}, indent=1))
    print(f"saved to {out} ({time.time() - t0:.0f}s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    from ralm.cli import run

    return run(train_lm, argv, "python -m demo.train_lm", description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
