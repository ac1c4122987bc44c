"""Whether a multiple-choice output stands by a letter it names: a hedge ("A or B"), a supposition or someone else's
answer ("If B is correct ...", "Many students think A is the answer", "D is the answer many students choose"), a turn
to another letter ("B is the answer. No, wait, it's D."), a denial ("The answer is not (A)"). :mod:`.scoring` reads
the letter with these rules (moved out of scoring.py to keep it under 1,000 lines).
"""

from __future__ import annotations

import re

# what follows a chain of joined letters that offers them all: the line's end, punctuation ("A or B.", "A, C"), or
# words that call them all right ("A and C are both true", "A or B could be correct"); any other word explains the
# first letter ("B, A and C are wrong", "C, A or B would double count", "B and I am sure")
_CHAIN_END = r"\**\s*\)?\**"
_QUOTE_END = r"[\"'`\]\u2019\u201d]?"  # the closing quote or bracket of a letter written "'B'" or "[B]"
_OFFERED = re.compile(
    _CHAIN_END + r"[^\S\n]*(?:[^\w\s*)]|\n|$)|" + _CHAIN_END
    + r"\s+(?:(?:are|is|seem|seems|look|looks|would|could|might|may|can|both|all|each|equally|also|be|possibly|probably"
    r"|potentially|likely)\s+)*(?:correct|right|true|possible|plausible|valid|acceptable|viable|reasonable|likely|work"
    r"|apply)\b", re.IGNORECASE)
# after the chain's end, a clause that calls the named letters wrong ("B, A and C, which are wrong", "B, A and C --
# both incorrect"): with the chosen letter first and a bare comma before the others, they are the rejected options
# explaining the choice, not offered beside it (the comma had made the chain an offer: no answer)
_REJECTED = re.compile(
    _CHAIN_END + r"[^\S\n]*(?:[,;:(\u2013\u2014]|--?)\s*(?:(?:which|that|as|since|because|they|these|those|both|all"
    r"|each|are|is|were|being|seem|seems|look|looks|clearly|obviously|definitely|also|plainly)\s+)*(?:wrong|incorrect|false"
    r"|invalid|not\s+(?:correct|right|true|valid)|ruled\s+out|eliminated|excluded)\b", re.IGNORECASE)


def _hedged(text: str, start: int, end: int, labels: str) -> bool:
    """Whether the option letter at ``text[start:end]`` is offered with another option: "A or B", "(A) and (C)",
    "either B or D", "A, B", "A/B", "option A or option B" state no single answer. The whole chain of joined
    letters counts, and only where it ends at punctuation, the end or words that call them all right ("A and C are
    both true"), or follows "either"/"both": "B, A and C are wrong", "(B), (A) is incorrect" and "B, A is wrong"
    name the others to explain the first, and "B, not A" joins no letter.
    """
    set_, low = re.escape(labels), re.escape(labels.lower())
    joiner = (r"\s*(?:,\s*(?:or|and)\b|,|/|&|\b(?:or|and)\b)\s*(?:(?i:maybe|possibly|perhaps|probably)\s+)?"
              r"(?:(?i:option|choice)\s*)?")
    quoted = rf"[\"'`\[\u2018\u201c]([{set_}{low}])[\"'`\]\u2019\u201d]"  # "'A' or 'B'", "[A] or [B]"
    after = re.compile(rf"{_QUOTE_END}{_CHAIN_END}{joiner}\**\s*(?:\(\s*([{set_}{low}])\s*\)|([{set_}])\b(?!['\u2019])"
                       rf"|{quoted})")
    before = re.compile(rf"(?:\(\s*([{set_}{low}])\s*\)|\b([{set_}])|{quoted})\**{joiner}\(?\s*\**"
                        rf"[\"'`\[\u2018\u201c]?$")
    letters = {text[start:end].upper()}
    # the chosen letter heads the chain, then a bare comma ("B, A and C, which are wrong"; not "A or B, ...")
    heads = not before.search(text, 0, start) and bool(re.match(rf"{_CHAIN_END}\s*,(?!\s*(?:or|and)\b)", text[end:]))
    while found := before.search(text, 0, start):
        letters.add(next(g for g in found.groups() if g).upper())
        start = found.start()
    while found := after.match(text, end):
        letters.add(next(g for g in found.groups() if g).upper())
        end = found.end()
    if len(letters) < 2:
        return False
    either = re.search(r"\b(?i:either|both)\s+(?:(?i:option|choice)\s*)?\(?\s*\**$", text[:start])
    if not either and heads and _REJECTED.match(text, end):
        return False
    end += bool(re.match(_QUOTE_END[:-1], text[end:]))  # past the last letter's closing quote or bracket
    return bool(either or _OFFERED.match(text, end))


# before a letter called right, in its clause: a supposition, a first thought or a denial ("If B is correct then ...",
# "At first I thought A is correct", "None of A, B or C is correct"); after it, a question or a condition ("A is
# correct? No", "A is correct only if ...")
_SUPPOSED_BEFORE = re.compile(r"\b(?i:if|whether|suppose\w*|assum\w*|thought|none\s+of|neither|not)\b"
                              r"(?:(?!\b(?i:but)\b)[^.?!;\n])*$")  # "A is correct if ..., but with it, D is correct"
_SUPPOSED_AFTER = re.compile(r"\s*(?:\?|(?i:(?:only\s+)?(?:if|when)\b))")
# after "X is the answer", a turn in its sentence ("but", "yet", "however"): someone else's answer where a supposition
# leads it ("One might think A is the answer, but option C fits"; read as stated, it beat the real one) or where the
# sentence goes on to call another letter right ("A is the answer most people pick, however C is correct"). Any turn
# disowned it before, and "B is the answer, but I am not fully sure." read no answer. "A is correct, but ..." states A
_TURN_AFTER = re.compile(r"[^.?!;\n]*?\b(?i:but|yet|however)\b")
_SUPPOSITION_BEFORE = re.compile(r"\b(?i:(?:one|someone|somebody|some|many|people|you)\s+(?:might|may|could|would)"
                                 r"\s+(?:\w+\s+)?(?:think|argue|say|believe|assume|guess|pick|choose|expect|claim)"
                                 r"|(?:may|might|could|would)\s+(?:seem|appear|look)|at\s+first(?:\s+(?:glance|sight))?)"
                                 r"\b[^.?!;\n]*$")  # not a doubt: "Though some may disagree, C is the answer, but ..."
# straight before "X is the answer", a subject other than "I"/"we" and a verb of opinion ("Many students think A is the
# answer", "Student 1 says", "John claims that", "You'd think", "A student might think") or a hypothetical ("It looks
# like", "tempting to say"): someone's answer, not the output's ("I think B is the answer", "I would say" state it).
# Read as stated, it outranked the correction after it ("... The correct response is (C).") and scored a rejected letter
_MODAL = (r"(?:would|could|might|may|can|will|should|shall|must|do|does|did|really|also|still|just|strongly|honestly"
          r"|personally|truly|certainly|definitely|often|usually|probably|naturally|wrongly|mistakenly)")
# not "suggests"/"shows"/"conclude": "The evidence suggests B is the answer" is the output's own reasoning
_OPINION = (r"(?:think|thinks|say|says|claim|claims|believe|believes|argue|argues|guess|guesses|assume|assumes"
            r"|insist|insists)")
_ATTRIBUTED_BEFORE = re.compile(
    rf"(?:(?<![\w'\u2019])(?:(?i:you|he|she|they|someone|somebody|some|many|most|people|person|others?|one|students?"
    rf"|teachers?|experts?|critics?|friends?|classmates?|partners?|colleagues?|parents?|brothers?|sisters?)"
    rf"|(?:(?i:student|person|player|speaker)\s+[A-Z0-9])|(?!(?i:we|i)\b)[A-Z][a-z]+|\d+)(?:['\u2019](?!s\b)[a-z]+)?"
    rf"\s+(?:(?i:{_MODAL})\s+)*(?i:{_OPINION})"
    r"|\b(?i:tempting\s+to\s+(?:think|say|pick|choose|assume|conclude)))"
    r"\s+(?i:that\s+)?(?:(?i:option|choice)\s*)?\**$")
# straight after "X is the answer", whose answer it is when not the output's: "D is the answer many students choose",
# "... that most people would pick", "... you might expect" (read as stated, D beat the "B." leading the output)
_ATTRIBUTED_AFTER = (rf"[^\S\n]+(?i:that\s+|which\s+)?(?:(?i:many|most|some|a\s+lot\s+of|lots\s+of)\s+)?"
                     rf"(?i:you|he|she|they|someone|somebody|people|others|students?|teachers?|experts?|test[-\s]takers"
                     rf"|readers|learners|beginners|many|most)\s+(?:(?i:{_MODAL})\s+)*(?i:{_OPINION}|choose|chooses|pick"
                     rf"|picks|select|selects|give|gives|expect|expects|go\s+for|goes\s+for|fall\s+for|falls\s+for)\b")
# a turn after "X is the answer": "but", "yet", "however", "wait", "no," or "actually" in its sentence or opening the
# next one ("B is the answer. No, wait, it's D.")
_TURN_ON = re.compile(r"[^.?!;\n]*?(?:[.?!;]\s*)?"
                      r"(?:\b(?i:but|yet|however|wait|actually)\b|\b(?i:no)\s*[,\u2014\u2013-])")


def _other_called_right(text: str, pos: int, letter: str, labels: str) -> bool:
    """Whether the rest of the sentence from ``pos`` calls a letter other than ``letter`` right ("option C fits", "C is
    correct", "the evidence points to option C"; not "some might choose A" or "D is also plausible")."""
    others = re.escape("".join(label for label in labels if label != letter))
    if not others:
        return False
    sentence = re.split(r"[.?!;\n]", text[pos:], maxsplit=1)[0]
    other = rf"(?:(?i:option|choice)\s*)?\(?[{others}]\b\)?\**"
    return bool(re.search(rf"(?<![\w'\u2019]){other}\s+(?i:fits|works|matches|is\s+(?:the\s+)?(?:correct|right|best"
                          rf"|better|real|actual|true|answer))\b|\b(?i:points?|pointing)\s+to\s+{other}", sentence))


def _other_chosen(text: str, pos: int, letter: str, labels: str) -> bool:
    """Whether the output from ``pos`` on names a letter other than ``letter`` as the choice, in any sentence: "it's
    (actually) C", "Actually, C.", "I would pick C", "the correct one/response is (C)", "C fits", "C is correct" (not
    "some might choose A", "D is also plausible" or "let me explain option A")."""
    others = re.escape("".join(label for label in labels if label != letter))
    if not others:
        return False
    other = rf"(?:(?i:option|choice)\s*)?\(?[{others}]\b\)?\**"
    ends = r"\s*(?:[.!,;]|$)"  # the letter ends its clause: "it is C.", not "it is A good idea"
    rest = text[pos:]
    # "C fits/matches/is true" in any later sentence, but not one that qualifies or rejects it (a walk-through: "C is
    # true of mammals but not of birds", "D matches part of it but not the main idea", "C fits only ...")
    for sentence in re.split(r"[.?!;\n]", rest):
        if re.search(r"\b(?i:only|not|but|wrong|incorrect|out|partly|part|although|though|except)\b", sentence):
            continue
        if re.search(rf"(?<![\w'\u2019]){other}\s+(?i:fits|works|matches|is\s+(?:the\s+)?(?:correct|right|best|better"
                     rf"|real|actual|true|answer))\b(?!\s+(?i:of|for|in|when|if)|{_ATTRIBUTED_AFTER})"
                     rf"|\b(?i:points?|pointing)\s+to\s+{other}", sentence):
            return True
    return bool(re.search(
        rf"\b(?i:it['\u2019]s|it\s+is|actually|rather|instead)\W+(?i:(?:actually|really|rather)\W+)?{other}{ends}"
        rf"|\b(?:I|[Ww]e)(?:['\u2019]d|['\u2019]ll|\s+(?i:would|will|should|must)(?:\s+rather)?)?\s+(?i:pick|choose"
        rf"|go\s+with|select|say)\s+{other}{ends}"
        rf"|\b(?i:(?:correct|right|real|actual|true|best)\s+(?:answer|option|choice|one|response)\s+is)\W+{other}"
        rf"|(?:^|[.!;:]\s*|,\s*)(?i:so|thus|therefore|hence)\W+(?:(?i:the\s+answer\s+(?:should|must|would)\s+be|it\s+is|it['\u2019]s)\W+)?{other}{ends}"
        rf"|\b(?i:answer\s+(?:should|must|would)\s+be)\W+{other}{ends}",
        rest))


def _supposed(text: str, start: int, end: int, labels: str) -> bool:
    """Whether "X is correct" at ``text[start:end]`` is supposed, asked or denied rather than stated: read as the
    answer, "A is correct? No, A is wrong. Option C." and "None of A, B or C is correct. Option D ..." gave A and C.
    "One might think A is the answer, but ..." is someone's answer the sentence turns from."""
    turn = _TURN_AFTER.match(text, end) if text[:end].lower().endswith("answer") else None
    letter = re.search(rf"[{re.escape(labels)}]", text[start:end])
    disowned = turn is not None and bool(_SUPPOSITION_BEFORE.search(text, 0, start) or _other_called_right(
        text, turn.end(), letter.group() if letter else "", labels))
    if text[:end].lower().endswith("answer"):
        # someone else's answer ("John claims A is the answer."), or one the output turns from to another letter in
        # any later sentence ("A is the answer, but wait, let me reconsider. Actually, C.")
        sentence_start = max(text.rfind(mark, 0, start) for mark in ".?!;\n") + 1
        turned = _TURN_ON.match(text, end)
        own = letter.group() if letter else ""
        disowned = disowned or bool(_ATTRIBUTED_BEFORE.search(text[sentence_start:start])) or (
            bool(re.match(_ATTRIBUTED_AFTER, text[end:])) and _another_called_right(text, own, labels)) or (
            turned is not None and _other_chosen(text, turned.end(), letter.group() if letter else "", labels))
    return bool(_SUPPOSED_BEFORE.search(text, 0, start) or _SUPPOSED_AFTER.match(text, end) or disowned)


# a conclusion that names its reasoning, not a person, as what says it ("Logic says B.", "The evidence points to C"):
# the output's own answer, where "Student 1 says B" is someone's (it read no answer)
_REASONING_SAYS = (r"(?:^|(?<=[.!?;:,]\s))[^\S\n]*(?i:(?:the|my|this|our)\s+)?(?i:logic|reasoning|analysis|evidence)"
                   r"\s+(?i:says|suggests|indicates|points\s+to|favou?rs)\s+(?:(?i:option|choice)\s*)?")


def _added_to_another(text: str, match: re.Match[str], labels: str) -> bool:
    """Whether the letter called right at ``match`` is called so "too" / "as well" after its sentence gave another
    letter a kind word ("B is plausible, but C is correct too."): the output holds both, and reading C scored it right
    whenever C was the key, as a hedge "B or C" would."""
    if not re.match(r"\s+(?i:too|as\s+well)\b", text[match.end():]):
        return False
    start = max(text.rfind(mark, 0, match.start()) for mark in ".?!;\n") + 1
    others = re.escape("".join(label for label in labels if label != match.group(1)))
    # "Since A is right and B is right, D is correct too" (D: "Both"/"All of the above") follows from the others
    if re.search(r"\b(?i:since|because|as|given|if|so|therefore|thus|hence)\b", text[start:match.start()]):
        return False
    return bool(others) and bool(re.search(
        rf"(?<![\w'\u2019])(?:(?i:option|choice)\s*)?\(?[{others}]\)?\**\s+(?i:is|seems|looks)\s+(?i:also\s+)?"
        r"(?i:plausible|possible|correct|right|valid|true|reasonable|likely)\b", text[start:match.start()]))


def _denied_letters(output: str, labels: str) -> set[str]:
    """The option letters a denial names ("The answer is not (A), since ...", "the correct choice isn't B", "the
    answer is not A or B"): the cue skips a denial, and a fallback then read its letter as the answer (the single
    bare "(A)" was the denial's own)."""
    set_, low = re.escape(labels), re.escape(labels.lower())
    letter = rf"[\s*]*(?:(?i:option|choice)\s*)?(?:\(\s*([{set_}{low}])\s*\)|([{set_}])\b(?!['\u2019]))\**"
    denial = re.compile(rf"(?i:(?:answer|choice|option)\s+(?:isn['\u2019]?t|is[:\s*]*not))\b:?{letter}")
    more = re.compile(rf"\s*(?:,\s*)?(?i:or|nor)\b{letter}")  # "not A or B" ("not A and B is right": B is not)
    denied = set()
    for match in denial.finditer(output):
        end = match.end()
        denied.add((match.group(1) or match.group(2)).upper())
        while found := more.match(output, end):
            denied.add((found.group(1) or found.group(2)).upper())
            end = found.end()
    return denied


def _another_called_right(text: str, letter: str, labels: str) -> bool:
    """Whether the output calls a letter other than ``letter`` right anywhere ("D is the answer most people pick. B is
    right though."): only then is "X is the answer <others> choose" someone else's answer; alone, "D is the answer you
    should choose" / "So C is the answer most experts pick" is the output's own (it read none)."""
    others = re.escape("".join(label for label in labels if label != letter))
    return bool(others) and bool(re.search(rf"(?<![\w'\u2019])\(?[{others}]\)?\**\s+(?i:is)\s+(?i:the\s+)?"
                                           r"(?i:correct|right|best|answer)\b", text))
