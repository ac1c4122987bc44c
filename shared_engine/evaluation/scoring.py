"""Answer extraction and scoring, one function per answer kind.

Each scorer takes the model's output and the record's reference answer(s) and returns a
:class:`Score`: what was extracted, whether it is correct, and a value in [0, 1] that the summary
averages (1/0 for correctness, token F1 for open QA, sentence chrF / 100 for translation).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from ..errors import EnsembleError


class Score(BaseModel):
    model_config = ConfigDict(frozen=True)
    extracted: str | None
    correct: bool
    value: float
    f1: float | None = None


# --- numbers (GSM8K) -----------------------------------------------------------------------------

_NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?|-?\.\d+"
# Markdown bold around the answer ("The answer is **18**.") is read through, as BBH's scorer does
_ANSWER_IS = re.compile(r"answer is[:\s*]*\$?\s*(?:\\boxed\{)?\s*(" + _NUMBER + ")", re.IGNORECASE)


def parse_number(text: str) -> Fraction | None:
    """``$1,234.50`` -> 1234.5 exactly (Fractions: ``0.1 + 0.2`` style errors cannot flip a verdict)."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_number(output: str) -> str | None:
    """The final answer: after 'The answer is', else after '####', else in \\boxed{}, else the last number."""
    for pattern in (_ANSWER_IS, re.compile(r"####\s*(" + _NUMBER + ")"), re.compile(r"\\boxed\{\s*(" + _NUMBER + ")")):
        matches = pattern.findall(output)
        if matches:
            return matches[-1].replace("$", "").replace(" ", "").rstrip(".")
    numbers = re.findall(_NUMBER, output)
    return numbers[-1].replace("$", "").replace(" ", "").rstrip(".") if numbers else None


def score_number(output: str, gold: str) -> Score:
    extracted = extract_number(output)
    value, reference = (parse_number(extracted) if extracted else None), parse_number(gold)
    correct = value is not None and reference is not None and value == reference
    return Score(extracted=extracted, correct=correct, value=float(correct))


# --- multiple choice (ARC, MMLU-Redux, BBH options) ------------------------------------------------

def extract_choice(output: str, labels: str) -> str | None:
    """The chosen option letter among ``labels`` (capital letters only: "a" is an article): the last
    'answer is (X)' / 'Answer: X', else the last '(X)', else a first line that is only the letter."""
    set_ = re.escape(labels)
    patterns = [rf"(?i:answer is)\s*:?[\s*]*\(?\s*([{set_}])\b", rf"(?i:answer)\**\s*:[\s*]*\(?\s*([{set_}])\b",
                rf"\(([{set_}])\)"]
    for pattern in patterns:
        matches = re.findall(pattern, output)
        if matches:
            return matches[-1]
    first_line = output.strip().split("\n", 1)[0].strip()
    lone = re.fullmatch(rf"\(?([{set_}])\)?[.:]?", first_line)
    return lone.group(1) if lone else None


def score_choice(output: str, gold: str, labels: str) -> Score:
    extracted = extract_choice(output, labels)
    correct = extracted == gold
    return Score(extracted=extracted, correct=correct, value=float(correct))


# --- BBH -----------------------------------------------------------------------------------------

def extract_bbh(output: str) -> str | None:
    """The text after the last 'the answer is' (the cot-prompts end 'So the answer is X.')."""
    matches = re.findall(r"answer is:?\s*(.+?)(?:\.\s*$|\.?\s*\n|$)", output, flags=re.IGNORECASE)
    return matches[-1].strip().strip("*").strip() if matches else None


def score_bbh(output: str, gold: str) -> Score:
    """Option targets ``(B)`` compare by letter; the rest (True, valid, 8, word lists, dyck closings)
    by exact string after trimming whitespace and a trailing period."""
    option = re.fullmatch(r"\(([A-R])\)", gold.strip())
    if option:
        extracted = extract_choice(extract_bbh(output) or output, "ABCDEFGHIJKLMNOPQR")
        correct = extracted == option.group(1)
        return Score(extracted=extracted, correct=correct, value=float(correct))
    extracted = extract_bbh(output)
    normalized = " ".join(extracted.split()).rstrip(".") if extracted is not None else None
    correct = normalized is not None and normalized.lower() == " ".join(gold.split()).lower()
    return Score(extracted=extracted, correct=correct, value=float(correct))


# --- open QA (NQ, TriviaQA, SQuAD) -----------------------------------------------------------------

def normalize_answer(text: str) -> str:
    """SQuAD's official normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if not pred or not ref:
        return float(pred == ref)
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def extract_short_answer(output: str) -> str:
    """The first non-empty line, without an 'Answer:' prefix or a trailing period."""
    for line in output.strip().splitlines():
        line = re.sub(r"^\s*(?:final\s+)?answer\s*:\s*", "", line.strip(), flags=re.IGNORECASE).strip()
        if line:
            return line.rstrip(".").strip()
    return ""


def score_qa(output: str, golds: list[str]) -> Score:
    """Exact match / F1 against the best-matching alias (the answer counts if it matches any)."""
    extracted = extract_short_answer(output)
    exact = any(normalize_answer(extracted) == normalize_answer(g) for g in golds)
    f1 = max((token_f1(extracted, g) for g in golds), default=0.0)
    return Score(extracted=extracted, correct=exact, value=float(exact), f1=f1)


# --- translation (FLORES) --------------------------------------------------------------------------

_LABEL = re.compile(r"^\s*(?:translation|übersetzung|traducere)\s*:\s*", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```[\w+-]*\s*$")


def extract_translation(output: str) -> str:
    """The translation in the output: its first paragraph, without a 'Translation:' label (models tend to
    add notes after it). Markdown code fences, and a lead-in line ending in ':' with the text after it
    ("The sentence translates as follows:"), are not the translation either: every run is read this way,
    so a member or an ensemble that wraps its answer is not scored on the wrapper."""
    lines = [line for line in output.strip().splitlines() if not _FENCE.match(line)]
    text = _LABEL.sub("", "\n".join(lines).strip())
    while True:
        first, _, rest = text.partition("\n")
        if not (first.rstrip().endswith(":") and rest.strip()):
            break
        text = _LABEL.sub("", rest.strip())
    return text.split("\n\n", 1)[0].strip()


def score_translation(output: str, reference: str) -> Score:
    """Sentence chrF as the per-sample value; BLEU and chrF proper are corpus-level (see corpus_translation)."""
    sacrebleu = _sacrebleu()
    hypothesis = extract_translation(output)
    chrf = sacrebleu.sentence_chrf(hypothesis, [reference]).score
    return Score(extracted=hypothesis, correct=False, value=chrf / 100)


def corpus_translation(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    sacrebleu = _sacrebleu()
    if not hypotheses:
        return {"bleu": 0.0, "chrf": 0.0}
    return {"bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2)}


def _sacrebleu():  # noqa: ANN202 - the module
    try:
        import sacrebleu
    except ImportError:
        raise EnsembleError("FLORES scoring needs sacrebleu: pip install 'safe-ensemble[eval]'") from None
    return sacrebleu
