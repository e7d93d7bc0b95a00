"""Open-domain QA with In-Context RALM (Ram et al., 2023, §7): retrieve once by the question, let a
reranker pick one of the top-k passages, put it before the question, and let the frozen LM answer.

Scoring is SQuAD's (lower-case, no punctuation, no articles, collapsed spaces; exact match and token F1,
the best over the gold answers). Question files: a JSON list or JSON lines of ``{"question", "answers"}``
(``answer`` for one), optionally with ``ctxs`` — the reference repository's DPR-result layout
(``{"id", "title", "text"}`` per passage, best first) — which then replaces BM25.

Rerankers: none, bm25, random, cosine, a trained one (they see the question as the prefix), and two that
read the LM: ``zero-shot`` (the passage under which the LM finds the question itself most likely) and
``oracle`` (the passage under which the gold answer is most likely: an upper bound, not a method).
"""

from __future__ import annotations

import collections
import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

import torch

from ralm.retrieval import Passage
from ralm.scoring import input_device
from ralm.selectors import StrideBatch
from ralm.settings import InputError

PROMPT = "{document}\n\nQ: {question}\nA:"
NO_DOC_PROMPT = "Q: {question}\nA:"


def normalize_answer(s: str) -> str:
    """SQuAD's normalisation: lower case, punctuation and the articles a/an/the removed, spaces collapsed."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, answers: list[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(a) for a in answers))


def contains_answer(prediction: str, answers: list[str]) -> float:
    """1 where a normalised gold answer occurs as whole words in the normalised prediction: the accuracy used
    for models that answer in a sentence ("He lives in Saibror.") where exact match sees only the short form."""
    pred = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(a) and f" {normalize_answer(a)} " in pred for a in answers))


def f1(prediction: str, answers: list[str]) -> float:
    def one(pred: str, gold: str) -> float:
        p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
        common = sum((collections.Counter(p) & collections.Counter(g)).values())
        if not p or not g:
            return float(p == g)
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    return max(one(prediction, a) for a in answers)


@dataclass
class Question:
    question: str
    answers: list[str]
    ctxs: list | None = None  # Passages given by the file (DPR layout), best first


def read_questions(path: str | Path) -> list[Question]:
    """Questions from a JSON list or JSON lines (``question``, ``answers`` or ``answer``, optional ``ctxs``)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--questions {str(path)!r} does not exist")
    try:
        raw = path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError as e:
        raise InputError(f"--questions {str(path)!r} is not UTF-8 text (byte {e.start}: {e.reason}); give a JSON "
                         "list or JSON lines of {\"question\": ..., \"answers\": [...]}") from None
    try:
        items = json.loads(raw) if raw.startswith("[") else [json.loads(line) for line in raw.splitlines() if line.strip()]
    except ValueError as e:
        raise InputError(f"--questions {str(path)!r}: not JSON or JSON lines ({e})") from None
    out = []
    for i, item in enumerate(items):
        answers = item.get("answers", [item["answer"]] if "answer" in item else None) if isinstance(item, dict) else None
        if not answers or not isinstance(item.get("question"), str):
            raise InputError(f"--questions {str(path)!r}, item {i}: needs \"question\" and \"answers\" (a list) or "
                             "\"answer\"")
        ctxs = None
        if item.get("ctxs"):
            ctxs = [Passage(str(c.get("id", j)), c.get("title", ""), c.get("text", ""), float(c.get("score", 0) or 0))
                    for j, c in enumerate(item["ctxs"])]
        out.append(Question(item["question"], [str(a) for a in answers], ctxs))
    return out


def _continuation_nll(lm, tok, contexts: list[str], continuation: str) -> list[float]:
    """Summed NLL of ``continuation`` after each context (one forward per context; no padding)."""
    device = input_device(lm)
    cont = tok(continuation, add_special_tokens=False)["input_ids"]
    out = []
    for c in contexts:
        ctx = tok(c)["input_ids"]
        ids = torch.tensor([ctx + cont], device=device)
        with torch.inference_mode():
            logp = torch.log_softmax(lm(input_ids=ids).logits[0, len(ctx) - 1:-1].float(), -1)
        out.append(float(-logp.gather(-1, torch.tensor(cont, device=device)[:, None]).sum()))
    return out


def choose(question: Question, candidates: list, reranker: str, selector, lm, tok, doc_of) -> int:
    """Index of the passage to use (-1: none)."""
    if not candidates or reranker == "none":
        return -1
    if reranker == "zero-shot":  # the LM's likelihood of the question itself, given each passage
        nll = _continuation_nll(lm, tok, [doc_of(p) + "\n\nQ:" for p in candidates], " " + question.question)
        return min(range(len(nll)), key=nll.__getitem__)
    if reranker == "oracle":  # the gold answer's likelihood: an upper bound
        prompts = [PROMPT.format(document=doc_of(p), question=question.question) for p in candidates]
        nll = _continuation_nll(lm, tok, prompts, " " + question.answers[0])
        return min(range(len(nll)), key=nll.__getitem__)
    return selector.select(StrideBatch(prefix_texts=[question.question], candidates=[candidates], stride_ids=[0]))[0]


def answer(lm, tok, prompt: str, max_new_tokens: int) -> str:
    """Greedy answer to ``prompt``: its first line after any leading blank space."""
    device = input_device(lm)
    ids = tok(prompt, return_tensors="pt")["input_ids"].to(device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.inference_mode():
        out = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          do_sample=False, pad_token_id=pad, top_k=None)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).lstrip().split("\n")[0].strip()
