"""Scoring a prediction against an item's gold answers, per task.

- `niah*`, `vt`: every gold value must appear in the answer as a whole word (RULER's string match);
  `score` is the fraction found, `correct` means all of them.
- `docqa`: the answer's first word against the gold word (SQuAD normalisation); `em` compares the
  whole first line, `f1` is token F1 on it.
- `types`: the annotation up to the closing backtick (the answer prefix opens one), compared after
  `normalize_type`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

from edgemem.data.tasks import normalize_type


@dataclass(frozen=True)
class Score:
    correct: bool
    score: float  # fraction of gold values found, or token F1
    em: bool


def first_line(prediction: str) -> str:
    for line in prediction.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(c for c in text if c not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def near_miss(prediction: str, gold: str, slack: int = 2) -> bool:
    """Whether the answer's first len(gold) digits hold all but at most `slack` of the gold number's
    digits in place: a recall that found the needle but lost digits (an error analysis, not a score)."""
    digits = "".join(ch for ch in prediction if ch.isdigit())[: len(gold)]
    return (
        len(digits) == len(gold)
        and sum(a == b for a, b in zip(digits, gold, strict=True)) >= len(gold) - slack
    )


def _contains_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text) is not None


def type_answer(prediction: str) -> str:
    """The annotation in an answer that continues "The type annotation is `"."""
    text = prediction.strip()
    text = text.split("`")[0] if "`" in text else first_line(text)
    return text.strip().rstrip(".").strip()


def score(task: str, prediction: str, answers: list[str]) -> Score:
    if task.startswith("niah") or task == "vt":
        found = sum(_contains_word(prediction, a) for a in answers)
        frac = found / len(answers)
        return Score(found == len(answers), frac, found == len(answers))
    if task == "docqa":
        line = first_line(prediction)
        words = normalize_answer(line).split()
        gold = normalize_answer(answers[0])
        return Score(
            bool(words) and words[0] == gold, token_f1(line, answers[0]), normalize_answer(line) == gold
        )
    if task == "types":
        same = normalize_type(type_answer(prediction)) == normalize_type(answers[0])
        return Score(same, float(same), same)
    raise ValueError(f"no scorer for task {task!r}")
