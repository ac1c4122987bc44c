"""Answer extraction and scoring, one function per answer kind.

Each scorer takes the model's output and the record's reference answer(s) and returns a
:class:`Score`: what was extracted, whether it is correct, and a value in [0, 1] that the summary
averages (1/0 for correctness, token F1 for open QA, sentence chrF / 100 for translation).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from ..errors import EnsembleError
from .choice_reading import (
    _REASONING_SAYS,
    _TURN_ON,
    _added_to_another,
    _denied_letters,
    _hedged,
    _other_chosen,
    _supposed,
)


class Score(BaseModel):
    model_config = ConfigDict(frozen=True)
    extracted: str | None
    correct: bool
    value: float
    f1: float | None = None


# --- numbers (GSM8K) -----------------------------------------------------------------------------

# a fraction "3/4" (not part of a date "3/4/2020" or of "3/4.5"), a mixed number "2 1/2" / "2 and 1/2": read
# whole, not as its first integer (3, 2), so "The answer is 24/7." is not 24
_FRACTION = r"(?<![\d/.])\d+/\d+(?![/\d]|\.\d)"
# a whole number: "1,234" or "1 234" (a space, no-break or thin space) groups thousands only in groups of exactly three
# digits, as GSM8K's golds write them, so "1 000" is 1000 while "1 2" and "1,2,3" are lists (their first or last
# number); Indian grouping "1,00,000" (a lakh) is 100000, not 1 or 00,000. A space also ends a label's number or a
# count: "Step 1 200 apples" is 200 and "5 100-dollar bills" is 5 (not 1200, 5100), so a space joins no digits after a
# word that numbers things (Step, Day, No., #...) nor before a hyphenated word. "out of" takes a total the same way:
# "Out of 100 250 passed" is 100 then 250, not 100250. Where a later group starts with 0 ("1 000", "2 050") the join
# is unambiguous (no number is written with a leading zero), so it stands in any context: "out of 1 000" is 1000
_NUMBERING = ("step", "day", "week", "month", "year", "round", "part", "no.", "number", "question", "problem", "stage",
              "phase", "level", "chapter", "page", "item", "case", "game", "lap", "line", "row", "option", "method",
              "out of")
_NOT_NUMBERED = "".join(rf"(?<!(?i:\b{re.escape(word)})\s)" for word in _NUMBERING) + r"(?<!(?<!#)#)(?<!(?<!#)#\s)"
_SPACED = r"[ \u00a0\u2009\u202f]"
_INTEGER = (r"(?:\d{1,2}(?:,\d{2})+,\d{3}(?!\d|,\d)|\d{1,3}(?:,\d{3})+(?!\d)"
            rf"|\d{{1,3}}(?:{_SPACED}\d{{3}})*{_SPACED}0\d{{2}}(?:{_SPACED}\d{{3}})*(?!\d)"
            rf"|{_NOT_NUMBERED}\d{{1,3}}(?:{_SPACED}\d{{3}})+(?!\d|-[^\W\d_])|\d+)")
# a time ("10:30", "7:00 pm") is one token, not its hours or its minutes (10, 30): GSM8K writes a time on the hour as
# the hour ("2:00 pm" is 2), so "7:00" parses as 7, while "10:30" parses as no number (no gold is a time of day)
_TIME = r"(?<![\d:])\d{1,2}:\d{2}(?::\d{2})?(?![\d:])"
_ON_THE_HOUR = re.compile(r"(\d{1,2}):00(?::00)?")
_NUMBER = rf"-?\$?\s*(?:{_INTEGER} +(?:and +)?{_FRACTION}|{_FRACTION}|{_TIME}|{_INTEGER}(?:\.\d+)?)|-?\.\d+"
# Markdown bold around the answer ("The answer is **18**.") is read through, as BBH's scorer does; "The answer isn't
# 12" / "is not 12" states no answer (read as 12 before), and no earlier cue stating the denied number is the answer
# either ("The answer is 12. Wait, the answer is not 12, it is 15."), so the next rule reads one; a cue stating another
# number stands ("The answer is 24. (The answer is not 12, ...)" is 24)
# A cue's sentence is read in a lookahead, so cues do not overlap and a later cue on the same line counts as one on a
# later line does ("The answer is 12, no wait, the answer is 15." is 15; the first cue's match ate the line before).
# "Answer: 42" / "Final answer: 42" / "**Answer:** 42" at a line's start state the answer too (as BBH's cue reads
# them), where a number starts what follows: "Answer: She sold 48/2 = 24 clips" is reasoning under a label, read
# by the rules below as it was before, not its calculation's 24
_ANSWER_IS = re.compile(r"(?:answer is\b(?![:\s*]*not\b)"
                        r"|^[\s#*]*(?:final\s+)?answer\**\s*:(?=[\s*]*(?:\\\(|\\?\$)*\s*-?\.?\d))"
                        r"(?=[:\s*]*([^\n]*))", re.IGNORECASE | re.MULTILINE)
_ANSWER_DENIED = re.compile(r"answer\s+(?:isn['\u2019]?t\b|is\b[:\s*]*not\b)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?!\d)")
# a Unicode minus sign ("−3") is a sign, not text; a vulgar fraction ("2½") and the fraction slash are fractions
_MINUS = str.maketrans({"\u2212": "-", "\u2044": "/", "½": " 1/2", "⅓": " 1/3", "⅔": " 2/3", "¼": " 1/4",
                        "¾": " 3/4", "⅕": " 1/5", "⅖": " 2/5", "⅗": " 3/5", "⅘": " 4/5", "⅙": " 1/6", "⅚": " 5/6",
                        "⅛": " 1/8", "⅜": " 3/8", "⅝": " 5/8", "⅞": " 7/8"})
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")  # \frac{3}{4}, 2\frac{1}{2}
_MIXED = re.compile(r"(-?)(\d{1,3}(?: \d{3})+|\d+) (\d+/\d+)")  # whole part "1 000" too


def parse_number(text: str) -> Fraction | None:
    """``$1,234.50`` -> 1234.5 exactly (Fractions: ``0.1 + 0.2`` style errors cannot flip a verdict); ``1 000`` -> 1000,
    ``7:00`` -> 7 (GSM8K's hour), ``10:30`` -> None."""
    cleaned = _clean(text.translate(_MINUS).replace(",", ""))
    try:
        mixed = _MIXED.fullmatch(cleaned)  # 2 1/2 is 2.5 (and -2 1/2 is -2.5), not 21/2
        if mixed:
            value = int(mixed.group(2).replace(" ", "")) + Fraction(mixed.group(3))
            return -value if mixed.group(1) else value
        hour = _ON_THE_HOUR.fullmatch(cleaned)
        return Fraction(int(hour.group(1))) if hour else Fraction(cleaned.replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


# what a stated answer that is a calculation starts with, up to its first '=': numbers, operators, currency,
# brackets, LaTeX operators and a unit after a number or a '/' ("$2 * 13 = $26", "3 x 5 = 15", "18 eggs = $36",
# "\\(2 \\times 13 = 26\\)", "15 gallons * 8 pints / gallon = 120", "3 km per hour * 2 = 6"; not a reason's
# "18 because 2 + 1 = 3"), with no bracket left open (in "540 m (3 sprints x 3 = 9 ...)" the '=' is in a remark)
_ARITHMETIC = re.compile(r"(?:[\d\s.,$+\-*/×÷xX·^%()\[\]{}\u2013\u2014]|\\(?:times|cdot|div|left|right|[()\[\]$])"
                         r"|(?<=[\d/])\s*(?!(?i:because|since|as|so|for|from|given|which|that|when|then|and|but|if|with"
                         r"|after|thus|hence|is|was|are|were)\b)[^\W\d_]+\b(?:\s+per\s+[^\W\d_]+\b)?)*")
# what starts a reason given after an answer, before its '=' ("18 because ...", "18, since ...", "540 m (3 x 3 = 9)"):
# without one, a sentence led by its number ("4 packages cost 4*$3=$12") still gives the result after its '='
_REASON = re.compile(r"\b(?i:because|since|as|given|so|which|when|after|if|thus|hence|i\.e|e\.g)\b"
                     r"|,(?!\d)|;|:(?!\d)|[(\[](?=[^)\]]*$)|[\u2013\u2014](?![^\S\n]*\$?\d)")
# a number starting a stated answer (through $, **, \(, \boxed{} and a sign): "The answer is 18 because ..." leads
# with its answer, while "The answer is the sum of 5 and 15." and "... is that there are 9 + 6 = 15 liters" open with
# words
_STARTS_NUMBER = re.compile(r"(?:[\s*$(]|\\[($\[]|\\boxed\{)*-?\s*\.?\d")


# a calculation's result given in words, read as its '=': "36 / 2, which is 18", "3 * 6, which equals 18", "12+6 equals
# 18", "3 times 6, which is 18", "half of 36, which is 18" (their first number, 36, 3, 12, was read). Only straight
# after a calculation (two numbers joined by an operator, or "half/twice/1/2/20% of N") and before any '=': "15, which
# is 3 more than 12" is 15, and "3 + 5 = 8, which is 2 more than 6" is 8. The calculation leads the text (after words
# only): in "24 cookies and 24 / 2 is 12 per friend" it is a later remark, which read 12. "2 of 4 days, which is 50%"
# is no calculation (it read 50), and the result is the nearest 'is' ("3 + 5 is 8, which is 2 more than 6" read 2).
# The second number may open brackets ("2 * (3 + 4), which is 14", "5 * $(2 + 1)"), and "2(3 + 4)" multiplies: with a
# digit required straight after the operator they read their first number, 2
_OPERATION = (r"\d\s*(?:[+\-*/×÷xX·^]|\\(?:times|cdot|div)\b|(?i:times|plus|minus|divided\s+by|multiplied\s+by)\b)"
              r"\s*\$?\s*[(\[]*\s*\$?\s*\.?\d|\d\(\s*\$?\s*\.?\d"
              r"|(?:(?i:\b(?:half|a\s+third|a\s+quarter|twice|double))|\d\s*%)\s+(?i:of)\s+\$?\s*\.?\d")
_WORDS_EQUAL = re.compile(rf"^([^\d=\n]*?[\d,.]*?(?:{_OPERATION})(?:[^=\n]*?(?:[\d)]|\b(?!(?i:which)\b)[^\W\d_]+))??)"
                          r"\s*,?\s*(?i:which\s+)?(?i:is(?:\s+equal\s+to)?|equals|gives|makes)\s+(?=[$\\(*\s-]*\.?\d)")


def _words_as_equals(text: str) -> str:
    """``3 * 6, which is 18`` -> ``3 * 6=18``: a result given in words reads as one after an '='."""
    return _WORDS_EQUAL.sub(r"\1=", text, count=1)


def _calculation_result(text: str) -> str:
    """Where a stated answer has an '=', the text after the last one if the answer opens with words ("that there are
    9 + 6 = 15 liters") or is a calculation up to its first '=' ("3 + 5 = 8" is 8); else the whole text: in "18
    because she sells 16 - 3 - 4 = 9 eggs" the '=' is in a reason given after the answer, and reading after it
    gave 9. A result in words after a calculation ("36 / 2, which is 18") counts as after an '='."""
    text = _words_as_equals(text)
    before, equals, _ = text.partition("=")
    if equals and not _STARTS_NUMBER.match(text):
        return text.rsplit("=", 1)[-1]
    plain = re.sub(r"\\[()\[\]]", "", before)  # LaTeX's \( \[ open maths, not a remark
    closed = all(plain.count(a) <= plain.count(b) for a, b in ("()", "[]", "{}"))
    calculation = bool(closed and _ARITHMETIC.fullmatch(before)) or not _REASON.search(before)
    return text.rsplit("=", 1)[-1] if equals and calculation else text


def _firm(answer: str) -> bool:
    """Whether a cue's stated answer (its line after the cue) reads one way: it leads with a number, and any '=' in its
    sentence is in a calculation. "The answer is the sum of 5 and 15." and "The answer is 5 apples per box, so for 4
    boxes: 4 * 5 = 20" (its first number, or its result?) are not, and rank below a '####' or \\boxed{} answer."""
    sentence = _words_as_equals(_SENTENCE_END.split(answer, 1)[0])
    return bool(_STARTS_NUMBER.match(sentence)) and ("=" not in sentence or _calculation_result(sentence) != sentence)


def _sentence_number(sentence: str, *, after_equals: bool) -> str | None:
    """The number a cue's sentence states (to the line's end or a full stop): after its last '=' where
    ``after_equals`` and the sentence is a calculation, else its first number."""
    sentence = _SENTENCE_END.split(sentence, 1)[0]
    number = re.search(_NUMBER, _calculation_result(sentence) if after_equals else sentence)
    return number.group(0) if number else None


def _denied_values(output: str) -> list[tuple[int, Fraction]]:
    """Where each denial ("the answer is not 12", "isn't 12") starts, and the number it denies (the first in
    its sentence); a denial naming no number ("the answer is not obvious") denies none."""
    denied = []
    for match in _ANSWER_DENIED.finditer(output):
        number = _sentence_number(output[match.end():].split("\n", 1)[0], after_equals=False)
        value = parse_number(number) if number else None
        if value is not None:
            denied.append((match.start(), value))
    return denied


def _stated_number(output: str) -> tuple[str | None, bool, int]:
    """The number stated after the last cue ('answer is', or a line's 'Answer: 42') that states one, on its line or a
    later one, and is not taken back: its sentence (to the line's end or a full stop), after its last '=' where it
    shows a calculation ("The answer is $2 * 13 = $26." is 26, not 2), else its first number (``\\(18\\)``, ``\\$18``
    and ``**18**`` read through); with whether that cue is :func:`_firm` (the caller ranks a loose one, "The answer
    is the sum of 5 and 15.", below a '####' or \\boxed{} answer, which it read 5 over). A later denial
    of that number ("the answer is not 12") takes it back, so a self-correction is not read as the answer it
    corrects, and no earlier cue stands in for it (that answer had replaced them): the next rule reads one. A denial
    of another number takes back nothing ("So the answer is 15. The answer is not 16." is 15; dropping every cue
    before a denial read the denied 16)."""
    for cue in reversed(list(_ANSWER_IS.finditer(output))):
        number = _sentence_number(cue.group(1), after_equals=True)
        if number is not None:
            value = parse_number(number)
            taken_back = any(start > cue.start() and value == gone for start, gone in _denied_values(output))
            return (None, True, 0) if taken_back else (number, _firm(cue.group(1)), cue.start())
    return None, True, 0


def _clean(number: str) -> str:
    """``$ 18.`` -> ``18``, ``- 1/2`` -> ``-1/2``; a mixed number keeps one space: ``2 and 1/2`` -> ``2 1/2``."""
    number = re.sub(r"\s+(?:and\s+)?", " ", number.replace("$", "").strip().rstrip(".").strip())
    return re.sub(r"^-\s+", "-", number)


def extract_number(output: str, *, cut: bool = False) -> str | None:
    """The final answer: after the last 'The answer is' / 'Answer: N' that states one, where it leads with it (and
    gives no reason with an '='), else after a '####', else in a \\boxed{} (written after that cue: an earlier
    "#### 2. Money" heading or "\\boxed{9} eggs" step is no final answer, and read 2 and 9), else that last cue's
    number where it states one another way ("... is that she has 9 + 6 = 15 liters", "18 because 16 - 3 - 4 = 9
    eggs"), else the last number (not where the output was ``cut`` at the token cap: that is the working's)."""
    output = _LATEX_FRACTION.sub(r" \1/\2", output.translate(_MINUS))
    stated, firm, at = _stated_number(output)
    if stated is not None and firm:
        return _clean(stated)
    for pattern in (re.compile(r"####\s*(" + _NUMBER + ")"), re.compile(r"\\boxed\{\s*(" + _NUMBER + ")")):
        matches = [m.group(1) for m in pattern.finditer(output) if stated is None or m.start() > at]
        if matches:
            return _clean(matches[-1])
    if stated is not None:
        return _clean(stated)
    if cut:
        return _concluded_number(output)
    numbers = re.findall(_NUMBER, output)
    return _clean(numbers[-1]) if numbers else None


# a sentence stating a result ("So she makes $18 per day.", "Therefore, ... 18.", "In total, ..."), not one going on
# with the working ("So, let's find ...", "So we need to ...")
_CONCLUDES = re.compile(r"[\s*#>-]*(?i:so|therefore|thus|hence|in\s+total|altogether|in\s+all)\b"
                        r"(?![,\s]*(?i:let['\u2019]?s|let\s+us|we\s+(?:need|have|can|will|must|should)\s+(?:to\s+)?"
                        r"(?:find|calculate|compute|figure|determine|add|subtract|multiply|divide|know)|first|next)\b)")


# a paragraph checking a result already stated ("Let me double check: ...", "To verify, ...", "Check: ..."): a
# conclusion above it still stands, unlike one above a paragraph of further working ("Next, ...", "Step 2: ...")
_CHECKING = re.compile(r"[\s*#>]*(?i:let(?:['\u2019]s|\s+me|\s+us)\s+(?:double[- ]?)?(?:check|verify|confirm)"
                       r"|to\s+(?:double[- ]?)?(?:check|verify|confirm)|(?:double[- ]?)?check(?:ing)?\b"
                       r"|verif(?:y|ication))")


def _concluded_number(output: str) -> str | None:
    """In an output cut at the token cap, the number of the last paragraph closed by a sentence stating a result (see
    _CONCLUDES): "So she makes $18 per day.\n\nLet me double check: 16 - 3 = 13, ... So 18" is 18 (it read none),
    after its last '=' where it shows a calculation ("So 9 * 2 = 18."), else its one number ("So in 2 weeks she reads
    14 pages." names two: none). Only where no paragraph of working follows it, only checks ("Let me double check",
    "To verify"): "So she has 13 eggs left.\n\nNext, she bakes ..." is an intermediate result. The paragraph cut off at
    the end counts only where its last sentence ended: a cut-off sentence's number is half-written working ("So he runs
    60 * 3 ="). A list item's "Therefore, the cost of 6 dozen is 6 x 55 = 330." is a step of the working, as is a
    conclusion another sentence of its paragraph goes on from."""
    paragraphs = re.split(r"\n[^\S\n]*\n\s*", output.strip())
    if not re.search(r"[.!?]$", paragraphs[-1]) or re.search(r"\d\.$", paragraphs[-1]):
        if not _CHECKING.match(paragraphs.pop()):
            return None  # the working went on past any conclusion above ("So she has 13 eggs left.\n\nNext, ...")
    for paragraph in reversed(paragraphs):
        line = paragraph.rstrip().rsplit("\n", 1)[-1]
        sentence = re.split(r"(?<=[.!?])\s+", line)[-1]
        if not re.match(r"\s|[-+*\u2022]\s|\d+[.)]\s", line) and _CONCLUDES.match(sentence):
            numbers = re.findall(_NUMBER, sentence.rsplit("=", 1)[-1])
            if len(numbers) == 1:  # "So in 2 weeks she reads 14 pages." names two: which is the result?
                return _clean(numbers[0])
        if not _CHECKING.match(paragraph):
            return None  # a later paragraph of working, not a check of the result above it
    return None


def _own_number_turn(output: str) -> str:
    """The output up to a line opening another turn ("The answer is 18.\n\nQuestion: <a question the model made up>
    ... The answer is 7." read 7), where its last line states the answer ('answer is', '####', \\boxed{}); else the
    whole output (a question restated before the working is part of it). A "Q:" / "Question:" on the very next line
    after an 'answer is' is a sub-question of the working ("The answer is 9.\nQ: How much does she make?\nA: 9 * 2 =
    18. The answer is 18.", least-to-most style, read 9): a made-up question follows a blank line, or a '####' or
    \\boxed{} answer, which no working goes on from; a chat turn ("User:", "Assistant:") opens one anywhere."""
    for opener in _NEW_TURN.finditer(output):
        own = output[:opener.start()]
        lines = [line for line in own.splitlines() if line.strip()]
        if not lines:
            return output
        marked = re.search(r"####|\\boxed\{", lines[-1]) is not None
        # a made-up problem brings numbers of its own ("Q: Tom has 3 apples and buys 4 more. How many ...?"); a
        # sub-question asks about the working's ("Q: How much does she make?")
        asked = re.split(r"\?", output[opener.end():].split("\n", 1)[0], maxsplit=1)[0]
        if not (marked or re.search(r"\d", asked) or re.search(r"\n[^\S\n]*\Z", own)
                or re.search(r"User|Human|Assistant", opener.group())):
            continue  # a sub-question step of the working
        stated, firm, _ = _stated_number(lines[-1])
        return own if (stated is not None and firm) or marked else output
    return output


def score_number(output: str, gold: str, finish: str | None = None) -> Score:
    """``finish``: why generation stopped, where the caller knows it; an answer cut at the token cap ("length") is not
    read by the last-number fallback (its last number is the working's, half written), only from a stated answer."""
    output = _own_number_turn(output)
    extracted = extract_number(output, cut=finish == "length")
    value, reference = (parse_number(extracted) if extracted else None), parse_number(gold)
    correct = value is not None and reference is not None and value == reference
    return Score(extracted=extracted, correct=correct, value=float(correct))


# --- multiple choice (ARC, MMLU-Redux, BBH options) ------------------------------------------------

# an "Option X" / "Choice (X)" mention that labels an item being analysed, not a choice: followed by a colon or a dash
# ("Option (A): ...", "**Option D**: ...", "Option B - ..."), or by "has"/"says"/... ("Option (A) has the order ..."),
# or heading a list item ("- Option C ..."). Read as the last 'option X', an output cut off mid walk-through ("...
# The adjective order that Option (A) has is [5. color") gave the option it was analysing
_LABEL_AFTER = re.compile(r"[)*]*\s*(?::|[-\u2013\u2014]+\s)|\)?\**\s+(?i:has|have|had|says|states|reads|contains"
                          r"|describes|lists|shows|gives|uses|would\s+(?:mean|give|be))\b")
_ITEM_START = re.compile(r"(?:^|\n)[^\S\n]*(?:[-+\u2022]|\*(?=\s)|\d+[.)])[^\S\n]*\**[^\S\n]*$")
# what makes a labelled item a conclusion, in that item's own text: "This is the most likely attribution", "This option
# is correct", "It is the best answer" (not "not the most likely", "incorrect", "the least likely")
# A verdict ends its clause or names what is right ("This is correct.", "It is the correct answer"; not "which is
# correct for the closest planet" or "It is the right size": a walk-through's remark read as its conclusion). An item
# that opens with its verdict or states one in its first sentence ("Option (B): correct. ...", "**Option C**: the best
# choice", "Option B: Venus is the correct answer.", "Option B: Venus - correct", "option B would be the best answer.")
# calls it right too (the first sentence of the item's first line): read as no choice, a one-option answer stated so
# read none
_VERDICT = (r"(?:correct|right|best)(?:\s+(?:answer|choice|option|one|explanation|order|ordering))?"
            r"(?=\s*(?:[.!;:)]|,(?!\s*(?:but|yet|though|although|however|except)\b)|$))")
_ITEM_CONCLUDES = re.compile(rf"\b(?i:this|it|which)(?:\s+(?i:option|choice|one))?\s+(?i:is)\s+"
                             rf"(?:(?i:the|clearly|therefore|thus)\s+)*"
                             rf"(?i:{_VERDICT}|best\b|most\s+(?:likely|plausible|accurate|appropriate)\b|answer\b)"
                             rf"|^[^.!?;,\n]*?(?:^|[:(\u2013\u2014]|\s-|\b(?i:is|be|has)\b)[\s*]*(?:(?i:the|clearly)\s+)*"
                             rf"(?i:{_VERDICT})|^[^.!?\n]*?\b(?i:is|be)\s+(?i:the\s+)?(?i:answer)(?=\s*(?:[.!,;]|$))")
# a conclusion leading the mention in its line ("Therefore, Option B: ...", "I choose Option (C):", "In conclusion,
# option B: ..."), or one naming it ("the answer must be Option (C): ...", "The best option here is Option B - ..."),
# or a line ending in such a lead-in above it, the mention heading a list item or a heading ("The correct answer is:
# \n\n- **Option B**: ...", "**Final Answer:**\n### Option B: ...") is a choice. Its end is the mention's (\Z: '$'
# also matched before the newline ending the line above, so "... to find the answer.\nOption (A): ..." was a choice)
_CONCLUDING_BEFORE = re.compile(
    r"\b(?i:so|therefore|thus|hence|finally|choose|pick|select|go\s+with|answer|conclusion)\b[^\w\n]*\Z"
    r"|\b(?i:answer|option|choice|one)(?:\s+here)?\s+(?i:is|would\s+be|must\s+be|should\s+be|will\s+be)[^\w\n]*\Z"
    r"|(?:\b(?i:answer|option|choice|one)(?:\s+here)?\s+(?i:is|would\s+be|must\s+be|should\s+be|will\s+be)"
    r"|(?:^|(?<=\n))[\s#*]*(?i:final\s+answer|conclusion)|\b(?i:therefore|thus|hence))"
    r"[^\S\n*]*\**:\**(?:[^\S\n]*\n[^\S\n]*(?:[-+\u2022*#]+|\d+[.)])?[^\S\n]*\**)+\Z")

# an "option X" its clause calls wrong ("Option A is wrong because ...", "Option B is not correct"): no choice. With the
# labels of a walk-through no choice (F1), the last-'option X' fallback went back to such a rejected mention ("Option
# A is incorrect.\n\nOption C: Earth is the correct answer." read A)
_CALLED_WRONG = re.compile(r"\)?\**\s+(?i:is|was|seems|appears|would\s+be|can\s+be)\s+"
                           r"(?:(?i:also|clearly|definitely|then)\s+)?(?i:wrong|incorrect|false|invalid|eliminated|ruled\s+out|not\s+(?:the\s+)?"
                           r"(?:correct|right|true|valid|best|answer))\b")
# a further labelled item after a lead-in's first ("The answer is:\n- Option A: ...\n- Option B: ..."): the lead-in
# introduces a walk-through of the options, not one answer (its first item was read as the choice)
_ANOTHER_LABEL = re.compile(r"\n[^\S\n]*(?:[-+\u2022*#]+|\d+[.)])?[^\S\n]*\**(?i:option|choice)\s*\(?[A-Z]\b"
                            r"[)*]*\s*(?::|[-\u2013\u2014]+\s)")
# the label of the item on the line after the one at the match's start: "\n(B) ...", "\nB. ...", "\n- Option B: ..."
_NEXT_ITEM = re.compile(r"[^\n]*(?:\n[^\S\n]*)+?(?=\S)(?:[-+\u2022*#]+|\d+[.)])?[^\S\n]*\**(?:\(([A-Z])\)|([A-Z])[.:)]"
                        r"|(?i:option|choice)\s*\(?([A-Z])\b[)*]*\s*(?::|[-\u2013\u2014]+\s))")
_OPTION_WORD_BEFORE = re.compile(r"(?i:\b(?:option|choice))\s*$")
# a conclusion leading a bare "(X)": "Therefore (C).", "... must be (C)", and a choice in the first person ("I pick (C)
# because ...", "I'd go with (C)", "My answer is (C)"), or "<reason> makes (C) the best fit": in an output cut at the
# token cap such a letter was no answer (read as a walk-through's)
_BARE_CONCLUDED = re.compile(r"\b(?i:therefore|thus|hence|so|final\w*|should\s+be|must\s+be|would\s+be"
                             r"|I(?:['\u2019](?:d|ll)|\s+(?:would|will))?\s+(?:(?i:pick|choose|go\s+with|select))"
                             r"|(?i:my\s+(?:final\s+)?(?:answer|choice|pick)\s+is))\W*$")
_MAKES_BEFORE = re.compile(r"\b(?i:makes?|making)\W*$")
_MAKES_BEST = re.compile(r"[)\s*]*(?i:the\s+)?(?i:best|correct|right)\s+"
                         r"(?i:answer|fit|choice|option|one|order(?:ing)?)\b"
                         r"(?=\s*(?:[.!;]|,(?!\s*(?:but|yet|though|although|however|except)\b)|$))")
# a choice in the first person that is only supposed ("If I pick (A), the order is ...", "Suppose I choose (A).",
# "Why would I select (C)?"): no conclusion
_SUPPOSED_CHOICE = re.compile(r"\b(?i:if|suppose|supposing|assuming|should|would|could|why|when|say|what\s+if)\s+I\b"
                              r"[^.!?\n]*$")


def _labels_item(text: str, start: int, end: int) -> bool:
    """Whether the "option X" mention at ``text[start:end]`` (``end`` after its letter) labels an item being analysed
    (see _LABEL_AFTER) rather than naming a choice, and its item does not call it right ("- **Option D**: ... This is
    the most likely attribution." states D)."""
    if not (_LABEL_AFTER.match(text, end) or _ITEM_START.search(text, 0, start)):
        return False
    lead_in = _CONCLUDING_BEFORE.search(text, 0, start)
    if lead_in and not ("\n" in lead_in.group(0) and _ANOTHER_LABEL.search(text, end)):
        return False
    # the item runs to the next labelled item or a blank line; under a Markdown heading ("### Option B: Venus"), to
    # the next heading (its paragraphs follow a blank line: "... This is the correct answer." was not its item)
    heading = re.search(r"(?:^|\n)[^\S\n]*#+[^\S\n]*\**[^\S\n]*$", text[:start]) is not None
    next_item = (r"\n[^\S\n]*#" if heading else r"\n\s*\n") + (
        r"|\n[^\S\n]*(?:[-+\u2022*#]+|\d+[.)])?[^\S\n]*\**(?i:option|choice)\b")
    item = re.split(next_item, text[end:], maxsplit=1)[0]
    # under a heading, the first line of its text states a verdict as a label's own line does ("### Option B: Venus
    # \nVenus is the right answer."): the heading's line holds only the option's text, and it read as no choice
    body = [line.strip() for line in item.split("\n")[1:] if line.strip()] if heading else []
    return not (_ITEM_CONCLUDES.search(item) or (body and _ITEM_CONCLUDES.search(body[0])))


def _items_called_right(text: str, mentions: list[re.Match[str]]) -> set[str]:
    """The letters of labelled items that call themselves right ("- Option A: ... - correct\n- Option B: ... -
    correct\n- Option C: ... - incorrect", a "which is false?" walk-through): with two or more, the list is a verdict
    on each option, not one choice (its last item called right was read, B). The scorer does not see the question, so
    the one item called otherwise (C) is no answer either."""
    return {m.group(1) for m in mentions
            if _LABEL_AFTER.match(text, m.end()) or _ITEM_START.search(text, 0, m.start())}


def _letter_end(text: str, end: int) -> int:
    """Past a cue's letter's closing bracket, quote or bold ("(D)", "**D**", "'D'")."""
    closing = re.match(r"[\s*]*[)\]\"'`\u2019\u201d]?\**", text[end:])
    return end + (closing.end() if closing else 0)


# what a number's punctuation says: a sign, a decimal point, a fraction's slash, an exponent ("-2" is not "2", "1/2" not
# "12", "1.2" not "12", "10^{-3}" not "10^{3}": with them dropped such options read the same and a letter stated with
# another's text, "(A) 2" where A is "-2" and B "2", was read as the letter)
# (a dash written for a minus, en dash or U+2010-2012, is a sign too: "–2" read as "2" made "(A) –2" another's text)
_NUMBER_MARK = re.compile(r"(?P<sign>(?<![\w.])[-\u2010-\u2013\ufe63\uff0d](?=\.?\d))"
                          r"|(?P<mark>(?<=\d)[./](?=\d)|\^)|[^\w\s]|_")


def _normalised(text: str) -> str:
    """An option's text for comparison: case, punctuation and spacing aside, but for a number's sign, decimal point,
    fraction slash and exponent."""
    text = _NUMBER_MARK.sub(lambda m: "-" if m.group("sign") else m.group("mark") or "", text.lower().translate(_MINUS))
    return " ".join(text.split())


def _text_of_other(text: str, end: int, letter: str, options: Mapping[str, str]) -> bool:
    """Whether what follows a cue's letter (its line, or that line's first sentence) is another option's text word for
    word and not the letter's own: "The answer is (D) They have each lost the same amount of potential energy.", that
    being option C's text, contradicts itself (read as D, it scored right where D was the key)."""
    line = text[end:].split("\n", 1)[0]
    said = {_normalised(line), _normalised(re.split(r"\.(?=\s|$)", line, maxsplit=1)[0])} - {""}
    own = _normalised(options.get(letter, ""))
    others = {_normalised(body) for label, body in options.items() if label != letter} - {"", own}
    return own not in said and bool(said & others)


def extract_choice(output: str, labels: str, options: Mapping[str, str] | None = None, *,
                   cut: bool = False) -> str | None:
    """The chosen option letter among ``labels`` (capital letters only, but for one in parentheses or a
    box after a cue: "a" is an article). The last explicit cue by position wins ('answer is (X)',
    'Answer: X', '\\boxed{X}', 'the correct choice is X'), so a final answer beats an earlier one
    and a later mention of another option does not; else a first line that starts with the letter
    ("B. 4", then an explanation naming other options; not the first item of a list of the options, "A. ...:
    incorrect\\nB. ..."); else the last letter called right ("D is correct.", not one supposed, asked or denied:
    "If B is correct ...", "A is correct? No"); else the last 'option/choice X'; else a bare '(X)' where the output
    names only that letter, or a conclusion leads it ("Therefore (C).": not a walk-through of the options). No
    fallback reads a letter a denial names ("The answer is not (A), since ..." is no answer, "not (A) but (B)" is B).
    A hedge there ("The answer is A or B.", "either B or D") is no answer: read as its first letter, it scored right
    whenever that letter was the key. A cue's letter cut off before its ')' at the output's end ("The answer is (B",
    at the token cap) is that letter. An 'option X' that labels an item being analysed ("Option (A): ...",
    "**Option D**: ...", "Option (A) has ...") is no choice unless its item calls it right. Given the ``options``'
    texts (label -> text), a cue's letter followed by another option's text word for word ("The answer is (D) <C's
    text>") contradicts itself: no answer. An output ``cut`` at the token cap is a walk-through cut mid-way where it
    states no answer: its last 'option X' and its one bare '(X)' count only after a conclusion ("Therefore (C).")."""
    set_ = re.escape(labels)
    low = re.escape(labels.lower())
    # the letter after a cue: "X", "(X)", "(x)", "**X**", "option X", "either X (or Y)"; in quotes, square brackets or
    # backticks ('"B"', "'B'", "[B]", "`B`": no answer before)
    letter = (rf"[\s*]*(?:(?i:either|both)\s+)?(?:(?i:option|choice)\s*)?(?:\(\s*([{set_}{low}])\s*\)|([{set_}])\b"
              rf"|[\"'`\[\u2018\u201c]\s*([{set_}{low}])\s*[\"'`\]\u2019\u201d]|\(\s*([{set_}{low}])[\s*]*\Z)")
    cues = [rf"(?i:(?:answer|choice|option)\s+is)\s*:?{letter}", rf"(?i:answer)\**\s*:{letter}",
            rf"\\boxed\{{\s*(?:\\text\{{)?\(?([{set_}{low}])\)?\}}?\s*\}}"]
    found = [(m.start(), m.span(g)) for pattern in cues for m in re.finditer(pattern, output)
             for g in range(1, len(m.groups()) + 1) if m.group(g)]
    # a cue heading a list of the options is no answer; a conclusion after the list may name one of them
    over_list = [span for start, span in found if _cue_over_list(output, start, span[1])]
    found = [(start, span) for start, span in found if span not in over_list]
    span: tuple[int, int] | None = max(found)[1] if found else None
    if span is not None and options and _text_of_other(
            output, _letter_end(output, span[1]), output[span[0]:span[1]].upper(), options):
        return None
    # a letter a denial names is no answer for the fallbacks below ("The answer is not (A), since x." read A)
    denied = _denied_letters(output, labels) if span is None else set()
    if span is None:
        first_line = output.strip().split("\n", 1)[0].strip()
        offset = output.index(first_line) if first_line else 0
        lead = re.match(rf"\**(?:\(([{set_}])\)\**(?=[\s.:]|$)|([{set_}])(?:[.:)]\**(?=\s|$)|\**$))", first_line)
        # the first item of a list of the options ("A. ...: incorrect\nB. ...") names no answer
        listed = {m.group(1) or m.group(2) for m in re.finditer(
            rf"^\s*\**(?:\(([{set_}])\)|([{set_}])[.:)])", output, flags=re.MULTILINE)}
        # a first line that turns from its letter to another ("(A). Wait, no. (C) is correct.") does not state it
        turned = _TURN_ON.match(first_line, lead.end()) if lead else None
        # ... unless it comes back to it ("(C). Actually, A is correct and B is correct, so it's C.")
        back = re.findall(rf"(?<![\w'\u2019])\(?([{set_}])\)?(?![\w'\u2019])",
                          first_line[turned.end():]) if turned else []
        if lead and turned and _other_chosen(first_line, turned.end(), lead.group(1) or lead.group(2), labels) and not (
                back and back[-1] == (lead.group(1) or lead.group(2))):
            lead = None
        if lead and len(listed) < 2 and (lead.group(1) or lead.group(2)) not in denied:
            group = 1 if lead.group(1) else 2
            span = (offset + lead.start(group), offset + lead.end(group))
    # after the first line, as the docstring says: "B. Photosynthesis\n\nExplanation: Option A is wrong" named its
    # answer first, and reading the later "option A" first gave A. A letter called right ("D is correct.", "Among the
    # options, B is the correct answer.") beats a mention of an option ("Option A is wrong. B is correct.")
    # "B is the answer." too (no answer before)
    # BBH hyperbaton's "(B) has the correct ordering" too (a walk-through cut off before "So the answer is (B).": its
    # "Option (B): ..." labels are no choice, and it read none)
    called_right = (rf"(?<![\w'\u2019])\(?([{set_}])\)?\**\s+(?:is\s+(?:the\s+)?(?:correct|right|best|answer)"
                    r"|has\s+the\s+correct\s+order(?:ing)?)\b")
    if span is None:
        named = [m for m in re.finditer(called_right, output)
                 if m.group(1) not in denied and not _supposed(output, m.start(), m.end(), labels)]
        # reasoning that says a letter counts only where no letter is called right ("C is correct. A naive
        # analysis suggests B." is C)
        named = named or [m for m in re.finditer(rf"{_REASONING_SAYS}\(?([{set_}])\)?\**(?=\s*(?:[.!]|$))", output,
                                                 flags=re.MULTILINE) if m.group(1) not in denied]
        if named and _added_to_another(output, named[-1], labels):
            return None
        span = named[-1].span(1) if named else None
    if span is None:
        mentions = list(re.finditer(rf"(?i:\b(?:option|choice))\s*\(?([{set_}])\b", output))
        several = len({m.group(1) for m in mentions}) > 1
        named = [m for m in mentions
                 if m.group(1) not in denied and not _labels_item(output, m.start(), m.end())
                 and not (several and _CALLED_WRONG.match(output, m.end()))
                 and not (cut and not _settled_mention(output, m))]
        # a verdict list calling two right is no choice, unless a mention after it names one ("... So the false
        # statement is option C.")
        span = named[-1].span(1) if named and not (len(_items_called_right(output, named)) >= 2 and _items_called_right(
            output, named[-1:])) else None
    if span is None:
        # only where the output names a single option in bare "(X)" form: a walk-through of "(A) ... (D) ..." (or one
        # cut off on its way) is no answer, not the last option it reached
        # nor an "Option (A)" that labels an item being analysed ("Option (A): ...", "the order Option (A) has is")
        # (a label's letter counts as named: "(A) does not have it. Option (B): ..." names two)
        every = [m for m in re.finditer(rf"\(([{set_}])\)", output) if m.group(1) not in denied]
        bare = [m for m in every if not (_OPTION_WORD_BEFORE.search(output, 0, m.start())
                                         and _labels_item(output, m.start(), m.end(1)))]
        # or where a conclusion leads the last one ("We eliminate (A) and (D). ... Therefore (C).")
        concluded = bool(bare) and not _SUPPOSED_CHOICE.search(output[:bare[-1].start()]) and bool(
            _BARE_CONCLUDED.search(output[:bare[-1].start()]) or (
                _MAKES_BEFORE.search(output[:bare[-1].start()]) and _MAKES_BEST.match(output, bare[-1].end())))
        span = bare[-1].span(1) if bare and ((len({m.group(1) for m in every}) == 1 and not cut) or concluded) else None
        if span is not None and not concluded and _walkthrough_label(output, bare[-1]):
            span = None  # "... each option step by step:\n\n(A) It is formed of" cut at the cap read A
    if span is None and over_list:
        return _concluded_item(output, over_list[-1][1], labels)
    if span is None or _hedged(output, *span, labels):
        return None
    return output[span[0]:span[1]].upper()


def _concluded_item(text: str, end: int, labels: str) -> str | None:
    """The item of a list of labelled options (its first label's letter ends at ``end``) that the lines after the list
    name by words only that item has ("**Answer:**\n\nOption A: The patient had ...\nOption B: The specialist had
    ...\n\nThe pronoun 'he' refers to the patient." is A); none where they name several, none or deny one."""
    item = re.compile(rf"^[^\S\n]*[-+\u2022*#]*[^\S\n]*\**(?i:option|choice)\s*\(?([{re.escape(labels)}])\b[)*]*\s*"
                      r"(?::|[-\u2013\u2014]+\s)(.*)$", re.MULTILINE)
    items = list(item.finditer(text, text.rfind("\n", 0, end) + 1))
    after = text[items[-1].end():] if items else ""
    if not items or re.search(r"\b(?i:not|no|never|wrong|incorrect|false)\b|n['\u2019]t\b", after):
        return None
    words = {m.group(1): set(re.findall(r"\w+", m.group(2).lower())) for m in items}
    said = set(re.findall(r"\w+", after.lower()))
    named = [letter for letter, own in words.items()
             if (own - set().union(*(w for other, w in words.items() if other != letter))) & said]
    return named[0] if len(named) == 1 else None


def _settled_mention(text: str, mention: re.Match[str]) -> bool:
    """Whether an "option X" mention settles on X without a cue: a conclusion leads it ("Therefore, option C"), or it
    labels an item that calls itself right ("- **Option D**: ... This is the most likely attribution."). In an output
    cut at the token cap, another mention is the walk-through's ("Let's look at option C, which" read C)."""
    return bool(_CONCLUDING_BEFORE.search(text, 0, mention.start()) or _LABEL_AFTER.match(text, mention.end())
                or _ITEM_START.search(text, 0, mention.start()))


def _cue_over_list(text: str, start: int, end: int) -> bool:
    """Whether a cue at ``start`` reads, across its line break, the first item of a list of labelled options
    ("**Final Answer:**\nOption A: Mercury\nOption B: Venus\n..."): the cue heads a list, not an answer (read as A).
    The item marked as the answer, if one is, is then read by the 'option X' fallback."""
    if "\n" not in text[start:end] or not (_LABEL_AFTER.match(text, end) or re.match(r"[).:]", text[end:end + 1])):
        return False
    # a list runs in order: the next item (blank lines aside) is the next letter ("Option A: ...\nOption B: ...",
    # "(A) Mercury\n(B) Venus"). One item followed by a heading or other items ("**Answer:**\nOption C: ...\n\n
    # **Explanation:**\n- Option A: ...", "Option C: Earth\n\nOption A: ... wrong") is the answer (it read none)
    following = _NEXT_ITEM.match(text, end)
    return following is not None and ord(next(g for g in following.groups() if g)) == ord(text[end - 1].upper()) + 1


# a walk-through's lead-in: its first item is a label being analysed, not a choice
_WALK_LEAD = re.compile(r"(?i:\beach\s+(?:of\s+the\s+)?(?:option|choice|answer|statement)s?\b"
                        r"|\bstep[\s-]+by[\s-]+step\b|\banaly[sz]e\b|\bevaluate\b|\bgo\s+through\b|\blook\s+at\s+(?:the|each|all)\b"
                        r"|\bthe\s+options?\s*:)")


def _walkthrough_label(output: str, mention: re.Match[str]) -> bool:
    """Whether the one bare "(X)" of an output labels the first item of a walk-through (cut at the cap before the
    next): it starts its line, and a walk-through's lead-in comes before it ("Let's analyze each option step by
    step:\n\n(A) It is ...") or the label is bold and followed by a colon ("**(A) Dyslexia**: a reading ...")."""
    line_start = output.rfind("\n", 0, mention.start()) + 1
    if output[line_start:mention.start()].strip(" \t*-\u2022#"):
        return False
    line_end = output.find("\n", mention.end())
    line = output[mention.end():line_end if line_end >= 0 else len(output)]
    bold_label = output[line_start:mention.start()].strip().startswith("**") and re.match(r"[^*\n]*\*\*\s*:", line)
    return bool(bold_label) or bool(_WALK_LEAD.search(output, 0, line_start))


def score_choice(output: str, gold: str, labels: str, options: Mapping[str, str] | None = None,
                 finish: str | None = None) -> Score:
    """``finish``: why generation stopped, where the caller knows it ("length": cut at the token cap, see
    :func:`extract_choice`). A cue in the output's own turn, before a line opening another ("The answer is (B).\n
    Question: <a question it made up> ... The answer is (A)."), is its answer (it read A), as for BBH."""
    own = _own_turn(output)
    if own != output and (extracted := extract_choice(own, labels, options)) is not None:
        return Score(extracted=extracted, correct=extracted == gold, value=float(extracted == gold))
    extracted = extract_choice(output, labels, options, cut=finish == "length")
    correct = extracted == gold
    return Score(extracted=extracted, correct=correct, value=float(correct))


# --- BBH -----------------------------------------------------------------------------------------

# "answer is X" anywhere; "Answer: X" where it starts a line ("**Final Answer:** X"), not "the answer: ..." in a reason.
# A denial ("The answer is not (A), since ...", "the answer isn't 7") states no answer, as for GSM8K's _ANSWER_IS: read
# as the last cue, it gave the denied answer; one that goes on to the answer ("not (A) but (B)", "not (A), it is (B)")
# states that. "The answer is not valid" is the answer invalid, not a denial
_BBH_CUE = re.compile(r"answer is\b(?![:\s*]*not\b(?![\s*]*valid\b)):?\s*([^\n]*)"
                      r"|answer is[:\s*]*not\b[^\n.]*?[\s,;]\s*(?:but|it\s+is|it['\u2019]s|rather)\s+([^\n]*)"
                      r"|^[\s#*]*(?:final\s+)?answer\**\s*:\s*([^\n]*)", re.IGNORECASE | re.MULTILINE)
_LABELS = ({"yes", "no"}, {"true", "false"}, {"valid", "invalid"})  # the targets that are a word of a pair
_BRACKETS = set("()[]{}<> ")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}


# a stated answer that is an option's label and its text, which does not call it wrong ("Option A: Mercury")
_OPTION_LABELLED = re.compile(r"[\s*]*(?i:option|choice)\s*\(?[A-R]\)?\**\s*(?::|[-\u2013\u2014]+\s)"
                              r"(?![^\n]*\b(?i:wrong|incorrect|false|not|or|and)\b)")
# a line that opens another turn of a conversation ("Q: ...", "Question:", "User:"), which a model went on to write
# after its answer; the stop sequence ("\nQ:") catches only one form
_BARE_ANSWER = re.compile(r"[\s*]*(?:\(?[A-Ra-r]\)(?:[^\S\n]+[^\n]*)?|[A-R][.:)]?|(?i:yes|no|true|false|valid|invalid)"
                          r"|-?\d+)[\s*.!]*")
_NEW_TURN = re.compile(r"\n[^\S\n]*(?:Q|Question|User|Human|Assistant)\s*:")


def _own_turn(output: str) -> str:
    """The output up to a line opening another turn ("(A)\n\nUser: ... So the answer is (B)."): a cue in a turn the
    model wrote on its own after answering read as the answer (B). The caller reads the whole output where this part
    states no answer ("Let's think.\nQ: ..." restating the question first)."""
    own = _NEW_TURN.split(output, maxsplit=1)[0] if output.strip() else output
    lines = [line for line in own.splitlines() if line.strip()]
    # only an answer stated outright: a bare one, or a cue on the last line stating a letter, a yes/no or a number
    if not lines or not (_BARE_ANSWER.fullmatch(own.strip()) or ((stated := extract_bbh(lines[-1])) is not None
                                                              and _BARE_ANSWER.fullmatch(_unwrapped(stated))
                                                              and not re.search(r"\b(?i:if|when|unless)\b", stated))):
        return output  # "Let me recheck (B).\nQuestion: <the question restated>\n... So the answer is (A)." is A
    return own


def extract_bbh(output: str) -> str | None:
    """The sentence after the last 'the answer is' or 'Answer:' (the cot-prompts end 'So the answer is
    X.'; "**Answer:** valid" and "Final answer: True" state one too): to the line's end or the first
    full stop before a space, so a reason given after it ("So the answer is Yes. This is because ...")
    is not part of the answer, while 3.5 keeps its point."""
    matches = list(_BBH_CUE.finditer(output))
    if not matches:
        return None
    sentence = next(g for g in matches[-1].groups() if g is not None)
    return re.split(r"\.(?=\s|$)", sentence, maxsplit=1)[0].strip().strip("*").strip()


def _unwrapped(answer: str) -> str:
    """The answer inside what models wrap it in: Markdown bold / code, a pair of quotes, ``\\boxed{}``,
    ``\\text{}``, ``$...$`` ("So the answer is 'valid'." is valid, `] ) )` is ] ) ))."""
    previous = None
    while answer != previous:
        previous = answer
        answer = answer.strip().strip("*`").strip()
        boxed = re.fullmatch(r"\$*\\(?:boxed|text|textbf|mathrm)\{(.*)\}\$*", answer, flags=re.DOTALL)
        if boxed:
            answer = boxed.group(1)
        elif len(answer) > 1 and answer[0] == answer[-1] and answer[0] in "'\"$":
            answer = answer[1:-1]
        elif len(answer) > 1 and answer[0] + answer[-1] in ("\u201c\u201d", "\u2018\u2019"):
            answer = answer[1:-1]
    return answer


def _bbh_label(output: str, stated: str | None, pair: set[str]) -> str | None:
    """A Yes/No, True/False or valid/invalid answer: the pair's word that starts the stated answer
    ("No!", "(No)", "No, the man did not", "'valid'"); without a stated answer, a first line that is
    the word before punctuation ("No. He did not mean to.", "**Yes**": not "No one ..."), else the
    last line that is only the word."""
    words = "|".join(sorted(pair, key=len, reverse=True))
    if stated is not None and "invalid" in pair and re.match(r"[(\s]*not\s+valid\b", _unwrapped(stated), re.I):
        return "invalid"  # "So the answer is not valid." (read no answer)
    if stated is not None:
        found = re.match(rf"[(\s]*({words})\b", _unwrapped(stated), flags=re.IGNORECASE)
        return found.group(1) if found else None
    lines = [_unwrapped(line) for line in output.strip().splitlines() if line.strip()]
    first = re.match(rf"({words})\**(?:[.!,:;]|$)", lines[0], flags=re.IGNORECASE) if lines else None
    if first:
        return first.group(1)
    bare = [m.group(1) for line in lines if (m := re.fullmatch(rf"({words})\**[.!]*", line, flags=re.IGNORECASE))]
    return bare[-1] if bare else None


def _bbh_number(stated: str) -> str | None:
    """A count or a result (object_counting, multistep_arithmetic): the number of the stated answer, after
    its last '=' ("8 apples", "**8**", "1 + 2 = 3", "\\boxed{-42}", "eight")."""
    text = _calculation_result(_unwrapped(stated).translate(_MINUS))  # "9 because 3 + 2 = 5 fruits" is 9
    word = re.match(r"\W*([a-z]+)\b(?![-\s]+(?:one|two|three|four|five|six|seven|eight|nine|hundred|thousand)\b)",
                    text.lower())  # "eight", not the twenty of "twenty-one"
    if word and word.group(1) in _NUMBER_WORDS:
        return _NUMBER_WORDS[word.group(1)]
    number = re.search(_NUMBER, text)
    return _clean(number.group(0)) if number else None


def score_bbh(output: str, gold: str, finish: str | None = None) -> Score:
    """Option targets ``(B)`` compare by letter: the first ``(X)`` in the answer's sentence (another
    option named after it is not the answer), else its letter as multiple choice reads it. The rest by
    what the target is: a word of a pair (Yes/No, True/False, valid/invalid) by the word that starts
    the answer, case aside; a number by value; word lists and dyck closings as the written string
    inside any quotes or bold (case, spacing and a final period aside; commas between the words, and
    the spaces between closing brackets, too). ``finish`` "length" (cut at the token cap): an option target is not
    read from a walk-through's fallbacks (see :func:`extract_choice`)."""
    own = _own_turn(output)
    if own != output and (score := score_bbh(own, gold)).extracted is not None:
        return score
    option = re.fullmatch(r"\(([A-R])\)", gold.strip())
    stated = extract_bbh(output)
    if option:
        first = re.search(r"\(([A-Ra-r])\)", stated or "")  # "(e)" too: in brackets a small letter is no article
        if first and stated is not None:  # "So the answer is (A) or (B)." is a hedge, no answer
            extracted = None if _hedged(stated, *first.span(1), "ABCDEFGHIJKLMNOPQR") else first.group(1).upper()
        elif (cut := re.fullmatch(r"[\s*]*\(\s*([A-Ra-r])[\s*]*", stated or "")) and output.rstrip().endswith(
                (stated or "").rstrip()):
            extracted = cut.group(1).upper()  # "So the answer is (B" cut at the token cap before its ')'
        else:
            # a letter in quotes or backticks ('So the answer is "B".') is that letter
            extracted = extract_choice(_unwrapped(stated) if stated else output, "ABCDEFGHIJKLMNOPQR",
                                       cut=finish == "length")
            rest = output[output.rfind(stated) + len(stated):] if stated else ""
            if extracted is None and stated and _OPTION_LABELLED.match(_unwrapped(stated)) and not re.search(
                    r"(?i:\b(?:option|choice))\s*\(?[A-R]\b|\([A-R]\)|(?<![\w'\u2019])[B-HJ-R](?![\w'\u2019])", rest):
                # "Final Answer:\nOption A: <text>": the cue, read across its line break, names the labelled option
                # (without the cue, the label read as an item being analysed: no answer)
                extracted = extract_choice("Answer: " + _unwrapped(stated), "ABCDEFGHIJKLMNOPQR")
        correct = extracted == option.group(1)
        return Score(extracted=extracted, correct=correct, value=float(correct))
    target = " ".join(gold.split())
    pair = next((p for p in _LABELS if target.lower() in p), None)
    if pair is not None:
        extracted = _bbh_label(output, stated, pair)
        correct = extracted is not None and extracted.lower() == target.lower()
    elif re.fullmatch(r"-?\d+", target):
        extracted = _bbh_number(stated) if stated is not None else None
        value = parse_number(extracted) if extracted is not None else None
        correct = value is not None and value == parse_number(target)
    else:
        extracted = " ".join(_unwrapped(stated).split()).rstrip(".") if stated is not None else None
        written = extracted or ""
        if "," not in target:
            written = " ".join(written.replace(",", " ").split())
        if set(target) <= _BRACKETS:
            written, target = written.replace(" ", ""), target.replace(" ", "")
        correct = extracted is not None and written.lower() == target.lower()
    return Score(extracted=extracted, correct=correct, value=float(correct))


# --- open QA (NQ, TriviaQA, SQuAD) -----------------------------------------------------------------

# typographic quotes and apostrophes are the ASCII ones (then dropped as punctuation): "“Hey Jude”" scored F1 0 against
# "Hey Jude" and "O’Neill" 0.5 against "O'Neill", as string.punctuation holds only the ASCII ones
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201b": "'", "\u00b4": "'", "`": "'",
                         "\u201c": '"', "\u201d": '"', "\u201e": '"'})


def normalize_answer(text: str) -> str:
    """SQuAD's official normalisation: lower case, no punctuation (typographic quotes too), no articles, single
    spaces."""
    text = text.translate(_QUOTES).lower()
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


# the lead-in of a short answer: "Answer:" in Markdown bold or a heading ("**Answer:** Paris", "### Answer: Paris")
# and a sentence "The answer is Paris." (both read "**Answer:** Paris", "The answer is Paris" whole: exact match 0)
_SHORT_LEAD = re.compile(r"^[\s*_#]*(?:(?:the\s+)?(?:final\s+)?answer\s+is\b[\s*_]*:?|(?:final\s+)?answer[\s*_]*:)"
                         r"[\s*_]*", re.IGNORECASE)


def extract_short_answer(output: str) -> str:
    """The first non-empty line, without an 'Answer:' / 'The answer is' lead-in or a trailing period."""
    for line in output.strip().splitlines():
        line = _SHORT_LEAD.sub("", line.strip()).strip()
        if line.count("**") % 2:  # the lead-in took one side of the bold: "**Answer: Paris**", "Answer: **Paris**"
            line = line.strip("*").strip()
        if line:
            return line.rstrip(".").strip()
    return ""


def usable_aliases(golds: list[str]) -> list[str]:
    """The aliases that say something once normalised (a row with none is not scored)."""
    return [g for g in golds if normalize_answer(g)]


def _as_written(text: str) -> str:
    """An answer made of symbols (``A+``, ``+-*/``, ``@``), which SQuAD's normalisation empties: case,
    spacing, quotes, bold and a final period aside."""
    return " ".join(text.translate(_QUOTES).strip().strip("*\"'").rstrip(".").lower().split())


def _alias_match(prediction: str, gold: str) -> tuple[bool, float]:
    """(exact match, F1) against one alias. One that normalises to "" (NQ's ``---``, ``)``, ``A+``)
    matched an empty or article-only answer; it is compared as written instead, never when empty."""
    if normalize_answer(gold):
        return normalize_answer(prediction) == normalize_answer(gold), token_f1(prediction, gold)
    same = bool(_as_written(gold)) and _as_written(prediction) == _as_written(gold)
    return same, float(same)


def score_qa(output: str, golds: list[str]) -> Score:
    """Exact match / F1 against the best-matching alias (the answer counts if it matches any)."""
    extracted = extract_short_answer(output)
    matches = [_alias_match(extracted, g) for g in golds]
    exact = any(m[0] for m in matches)
    f1 = max((m[1] for m in matches), default=0.0)
    return Score(extracted=extracted, correct=exact, value=float(exact), f1=f1)


# --- translation (FLORES) --------------------------------------------------------------------------

# a label before the translation, in Markdown bold or not ("**Translation:** ...", "German: ...", "Deutsch: ..."), or a
# lead-in on the same line ("Here's the translation: ..."): scored as part of the translation before
_LABEL = re.compile(r"^\s*[*_]*(?:(?:translation|übersetzung|traducere|german|deutsch|english|englisch|romanian|română"
                    r"|rumänisch)[*_]*\s*:|(?:(?:sure|okay|ok|certainly)\W{0,3})?here(?:['\u2019]s|\s+is)\b[^:\n]{0,60}?"
                    r"(?:translation|übersetzung|traducere)[^:\n]{0,30}:)[*_]*\s*", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```[\w+-]*\s*$")
# a lead-in line with no colon ("Sure! Here is the translation.", "Here is the translation into German"), with the
# translation on the lines after it: it was scored as the translation (chrF 12 for a perfect one). After the word
# "translation" only a short "of/into/in <language>", a bracketed aside, a remark after a comma (", but I am unsure")
# and punctuation: any 40 characters dropped a translation on the lead-in's line ("Here is the translation — Der Hund
# bellt.") and a sentence that only starts so ("Here is the translation the U.N. commissioned in 1990."). What is
# translated may come before or after the language ("of the sentence into Spanish", "of your sentence in Spanish", "to
# Spanish of the sentence above"): without it such a lead-in was kept as the translation's first line
_OBJECT = r"\s+of\s+(?:the|this|your|my|given|following|above)(?:\s+[^\W\d_]+){1,2}"
_LEAD_IN = re.compile(r"\s*[*_]*(?:(?:sure|okay|ok|certainly|of\s+course)\W{0,3})?here(?:['\u2019]s|\s+is)\b"
                      r"[^:\n]{0,60}?(?:translation|übersetzung|traducere)\b"
                      rf"(?:{_OBJECT})?(?:\s+(?:of|into|in|to)\s+(?:the\s+)?[^\W\d_]+(?:\s+[^\W\d_]+)?)?(?:{_OBJECT})?"
                      r"(?:\s*\([^()\n]{0,30}\))?"
                      r"(?:\s*,\s*(?:which|but|though|although|as|since|because|I|it)\b[^:\n]{0,40})?\s*[.!:]?[*_]*\s*",
                      re.IGNORECASE)


def extract_translation(output: str) -> str:
    """The translation in the output: its first paragraph, without a 'Translation:' label (models tend to
    add notes after it). Markdown code fences, and a lead-in line ending in ':' with the text after it
    ("The sentence translates as follows:", or "Sure! Here is the translation." with no colon), are not the
    translation either: every run is read this way,
    so a member or an ensemble that wraps its answer is not scored on the wrapper."""
    lines = [line for line in output.strip().splitlines() if not _FENCE.match(line)]
    text = _LABEL.sub("", "\n".join(lines).strip())
    while True:
        first, _, rest = text.partition("\n")
        if not ((first.rstrip().endswith(":") or _LEAD_IN.fullmatch(first)) and rest.strip()):
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
        raise EnsembleError("FLORES scoring needs sacrebleu: pip install -e '.[eval]' in a clone") from None
    return sacrebleu
