"""Prompts: chat messages (so each member applies its own chat template), few-shot where a train
split exists. Change ``PROMPT_VERSION`` whenever a prompt changes: it is written into every
sample and summary, and ``--resume`` refuses to mix versions.

| benchmark | exemplars | instruction (system message) |
|---|---|---|
| gsm8k | first 4 of GSM8K train, worked solutions with ``<<calc>>`` notes removed, ``#### N`` -> ``The answer is N.`` | step by step, end with "The answer is N." |
| math500 | none (no train split here) | step by step, final answer in ``\\boxed{}`` |
| arc-challenge | 4 from ARC-Challenge dev, the first with each answer letter A-D (no rationales there): "The answer is (X) <option text>." | choose one option; may reason briefly; end with "The answer is (X)." |
| mmlu-redux | none (no dev split here) | step by step, end with "The answer is (X)." |
| bbh | the task's 3 cot-prompts (chain-of-thought written by the BBH authors) | the task description from the cot-prompt file |
| nq, triviaqa, squad | AdaFuse's few-shot prompt files (``prompts/adafuse/*_prompt.txt``) | their instruction text |
| flores | none; AdaFuse's instruction files | their instruction text (translate only) |

Few-shot exemplars are alternating user / assistant messages, the question is the last user message.
Test questions that appear verbatim in a prompt file (AdaFuse's SQuAD prompt takes its exemplars
from the first SQuAD records) are dropped and counted as skipped.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from ..errors import InvalidRequestError
from .datasets import Record, load_arc

PROMPT_VERSION = "eval-prompts-v3"
"""v3: the same messages; members without a chat template (Gemma base) read few-shot answers as
``Assistant:\n<answer>``, like their generation prompt (members/chat.py). Runs of chat-template
members are the same under v2 and v3."""

Messages = list[dict[str, str]]

GSM8K_SHOTS, ARC_SHOTS = 4, 4

GSM8K_SYSTEM = ("Solve the math word problem step by step. Finish with a line of the form "
                "'The answer is N.' where N is the final number.")
MATH_SYSTEM = "Solve the math problem step by step. Put your final answer within \\boxed{}."
ARC_SYSTEM = ("Answer the multiple-choice science question. You may reason briefly first; finish with "
              "'The answer is (X).' where X is the letter of the correct option.")
MMLU_SYSTEM = ("Answer the multiple-choice question. Think step by step, then finish with "
               "'The answer is (X).' where X is the letter of the correct option.")


def _with_shots(system: str, shots: list[tuple[str, str]], question: str) -> Messages:
    messages = [{"role": "system", "content": system}]
    for user, assistant in shots:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages + [{"role": "user", "content": question}]


def format_choices(record: Record) -> str:
    return record.question + "\n" + "\n".join(f"({c.label}) {c.text}" for c in record.choices)


# --- GSM8K ---------------------------------------------------------------------------------------

@cache
def gsm8k_shots(train_file: Path) -> tuple[tuple[str, str], ...]:
    """The first ``GSM8K_SHOTS`` rows of the train split as worked exemplars. Blank lines are skipped (the
    split's loader skips them too); a row that is no exemplar is an error naming the file and line, not a
    JSONDecodeError or KeyError traceback from every eval and calibrate that reads the folder."""
    if not train_file.is_file():
        raise InvalidRequestError(f"GSM8K exemplars need the train split: {train_file} not found")
    shots: list[tuple[str, str]] = []
    try:
        with train_file.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if len(shots) == GSM8K_SHOTS:
                    break
                if line.strip():
                    shots.append(_gsm8k_shot(line, train_file, number))
    except UnicodeDecodeError:
        raise InvalidRequestError(f"{train_file} is not UTF-8 text; the GSM8K exemplars are read from it "
                                  "(GSM8K train format)") from None
    return tuple(shots)


def _gsm8k_shot(line: str, train_file: Path, number: int) -> tuple[str, str]:
    """One exemplar: the question and its worked solution, ``<<calc>>`` notes removed, ``#### N`` ->
    ``The answer is N.``"""
    at = f"{train_file}, line {number}"
    expected = 'the GSM8K exemplars are read from its first rows, one {"question": ..., "answer": "... #### N"} per line'
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise InvalidRequestError(f"{at}: not JSON ({err.msg}); {expected}") from None
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or \
            not isinstance(row.get("answer"), str):
        raise InvalidRequestError(f'{at}: no "question" and "answer" strings; {expected}')
    if "####" not in row["answer"]:
        raise InvalidRequestError(f'{at}: the "answer" has no "#### N" final answer; {expected}')
    body, final = row["answer"].rsplit("####", 1)
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return row["question"], f"{body}\nThe answer is {final.strip()}."


def gsm8k_messages(record: Record, train_file: Path) -> Messages:
    return _with_shots(GSM8K_SYSTEM, list(gsm8k_shots(train_file)), record.question)


def math_messages(record: Record) -> Messages:
    return _with_shots(MATH_SYSTEM, [], record.question)


# --- multiple choice -----------------------------------------------------------------------------

@cache
def arc_shots(dev_file: Path) -> tuple[tuple[str, str], ...]:
    """One exemplar per answer letter A-D from the dev split. Blank lines are skipped; a malformed line or
    a row that is JSON but no ARC record is an error naming the file and line (load_arc), not a KeyError
    or UnicodeDecodeError traceback from every eval and calibrate that reads the folder."""
    if not dev_file.is_file():
        raise InvalidRequestError(f"ARC exemplars need the dev split: {dev_file} not found")
    expected = "the ARC exemplars are read from it (AI2's ARC-Challenge dev format, one record per line)"
    try:
        records = load_arc(dev_file).records  # a row of the wrong shape is an error naming its row
    except InvalidRequestError as err:
        raise InvalidRequestError(f"{err}; {expected}") from None
    shots, letters = [], set()
    for record in records:      # one exemplar per answer letter: tiny models copy the
        answer = record.answers[0]  # exemplars' letters (3 plain first shots gave 80% "C")
        if answer in letters or len(record.choices) != 4:
            continue
        letters.add(answer)
        text = next(c.text for c in record.choices if c.label == answer)
        shots.append((format_choices(record), f"The answer is ({answer}) {text}."))
        if len(shots) == ARC_SHOTS:
            break
    return tuple(shots)


def arc_messages(record: Record, dev_file: Path) -> Messages:
    return _with_shots(ARC_SYSTEM, list(arc_shots(dev_file)), format_choices(record))


def mmlu_messages(record: Record) -> Messages:
    subject = (record.group or "").replace("_", " ")
    system = MMLU_SYSTEM + (f" The subject is {subject}." if subject else "")
    return _with_shots(system, [], format_choices(record))


# --- BBH -----------------------------------------------------------------------------------------

@cache
def bbh_prompt(cot_file: Path) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The task description and its 3 (question, chain-of-thought answer) exemplars."""
    if not cot_file.is_file():
        raise InvalidRequestError(f"BBH chain-of-thought prompt not found: {cot_file}")
    text = cot_file.read_text(encoding="utf-8")
    if "\n-----\n" in text:  # canary header
        text = text.split("\n-----\n", 1)[1]
    blocks = re.split(r"\n\s*\n(?=Q: )", text.strip())
    description, shots = blocks[0].strip(), []
    for block in blocks[1:]:
        question, _, answer = block.partition("\nA: ")
        if not answer:
            raise InvalidRequestError(f"{cot_file}: exemplar without 'A: ': {block[:60]!r}")
        shots.append((question.removeprefix("Q: ").strip(), answer.strip()))
    if not shots:
        raise InvalidRequestError(f"{cot_file}: no 'Q: ... A: ...' exemplars")
    return description, tuple(shots)


def bbh_messages(record: Record, cot_dir: Path) -> Messages:
    description, shots = bbh_prompt(cot_dir / f"{record.group}.txt")
    system = f"{description} Think step by step, then finish with 'So the answer is <answer>.'"
    return _with_shots(system, list(shots), record.question)


# --- AdaFuse prompt files (open QA, translation) ---------------------------------------------------

@cache
def adafuse_prompt(prompt_file: Path) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Instruction text and (question, answer) exemplars of one of AdaFuse's prompt files."""
    if not prompt_file.is_file():
        raise InvalidRequestError(f"prompt file not found: {prompt_file}")
    text = prompt_file.read_text(encoding="utf-8")
    parts = re.split(r"^Question:[ \t]*\n?", text, flags=re.MULTILINE)
    instruction = re.sub(r"\n\s*Examples:\s*$", "", parts[0].strip()).strip()
    shots = []
    for part in parts[1:]:
        question, sep, answer = part.partition("\nAnswer:")
        if sep:
            shots.append((question.strip(), answer.strip()))
    return instruction, tuple(shots)


def qa_messages(record: Record, prompt_file: Path) -> Messages:
    instruction, shots = adafuse_prompt(prompt_file)
    return _with_shots(instruction, list(shots), record.question)


def in_prompt(record: Record, prompt_file: Path) -> bool:
    """The record is one of the prompt's exemplars (scoring it would measure copying)."""
    _, shots = adafuse_prompt(prompt_file)
    question = " ".join(record.question.split())
    return any(" ".join(q.split()) == question for q, _ in shots)


def flores_messages(record: Record, prompt_file: Path) -> Messages:
    instruction, _ = adafuse_prompt(prompt_file)
    return [{"role": "system", "content": instruction}, {"role": "user", "content": record.question}]
