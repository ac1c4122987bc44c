"""MATH-500: the boxed answer, LaTeX normalisation and equivalence.

Two answers are equal when their normalised strings match (``\\dfrac{1}{2}`` = ``\\frac12``,
``90^\\circ`` = ``90``, ``5.4 \\text{ cents}`` = ``5.4``, ``10,\\!080`` = ``10080``), when they are
tuples / intervals / matrices whose parts are equal one by one, or when both parse to the same
value or expression with sympy (``0.5`` = ``\\frac{1}{2}``, ``2\\sqrt{5}`` = ``\\sqrt{20}``,
``1+2x`` = ``2x+1``). Only strings made of digits, operators, single-letter variables and known
function names reach sympy, so a model's output is never evaluated as code.
"""

from __future__ import annotations

import re

from .scoring import Score

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def _boxed_at(text: str, start: int) -> str | None:
    """The content of the box whose ``\\boxed`` ends at ``start``: ``{...}`` (balanced braces) or ``5``; None where
    it is cut off."""
    if start < len(text) and text[start] == "{":
        depth = 0
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start + 1:i]
        return None
    match = re.match(r"([^\s$]+)", text[start:])
    return match.group(1) if match else None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces) or ``\\boxed 5``; an unbalanced one (cut off) is
    skipped for an earlier one."""
    for start in reversed([m.end() for m in _BOXED.finditer(text)]):
        content = _boxed_at(text, start)
        if content is not None:
            return content
    return None


# A stated answer: "the answer is", a "Final Answer:" label anywhere (Minerva's "Final Answer: The final
# answer is $x$. I hope it is correct.", "**Final Answer:** $x$") or an "Answer:" label leading a line.
_CUE = re.compile(r"\banswer\s+is\b(?![:\s*]*(?:not|correct|right|wrong|incorrect|consistent|valid|reasonable"
                  r"|unclear|helpful|clear)\b)\s*:?|\bfinal\s+answer\s*(?:\*\*)?\s*:|^[ \t>#*]*answer\s*(?:\*\*)?\s*:",
                  flags=re.IGNORECASE | re.MULTILINE)
# Math delimiters an answer may open with, and what closes each ($$ before $: "$$x$$" is not "$" "$x$" "$")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_SENTENCE_END = re.compile(r"\.(?=\s|$)|\n")


def _stated_answer(text: str) -> str | None:
    """The answer after a cue: the first closed math span it opens with, else its sentence.

    Only an answer that ended its line was read before, so "... is $3\\sqrt{2}$. I hope it is correct."
    had none; a closed "$...$" / "\\(...\\)" is the whole answer, whatever text follows it."""
    text = text.lstrip(" \t*\n").lstrip("*")
    for opening, closing in _DELIMITERS:
        if text.startswith(opening):
            # a "$" closes only unescaped: "$\\$18.90$" is one span
            close = re.compile(r"(?<!\\)" + re.escape(closing)) if "$" in closing else re.compile(re.escape(closing))
            end = close.search(text, len(opening))
            if end is not None:
                return text[len(opening):end.start()].strip() or None
            break  # unclosed (cut off): the sentence, its opening dropped below
    end = _SENTENCE_END.search(text)
    sentence = text[:end.start()] if end else text
    return sentence.strip().strip("$*").strip() or None


def extract_math(output: str) -> str | None:
    """The last ``\\boxed{}``; without one, the answer stated after the last cue that states one."""
    boxed = last_boxed(output)
    if boxed is not None:
        return boxed.strip()
    for cue in reversed(list(_CUE.finditer(output))):
        answer = _stated_answer(output[cue.end():])
        if answer is not None:
            return answer
    return None


def _unwrap(text: str, command: str) -> str:
    """``\\text{abc}`` -> ``abc`` (balanced braces)."""
    out, i = [], 0
    while (j := text.find(command + "{", i)) != -1:
        out.append(text[i:j])
        depth, k = 0, j + len(command)
        while k < len(text):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                break
            k += 1
        out.append(text[j + len(command) + 1:k])
        i = k + 1
    out.append(text[i:])
    return "".join(out)


_UNIT_WORDS = (r"(?:degrees?|cents?|dollars?|units?|inches|inch|feet|foot|ft|meters?|cm|mm|km|m|miles?|hours?|"
               r"minutes?|seconds?|days?|weeks?|years?|sq|square|cubic|points?|people|students|pounds?|ounces?)")


def normalize_math(answer: str) -> str:
    s = answer.strip()
    s = re.sub(r"\\(?:mbox|text|textbf|mathrm)\{\s*" + _UNIT_WORDS + r"(?:\s+" + _UNIT_WORDS + r")*\s*\}(\^\{?\d\}?)?",
               "", s) if re.search(r"\d", s) else s
    for command in (r"\text", r"\textbf", r"\mbox", r"\mathrm", r"\mathbf"):
        s = _unwrap(s, command)
    s = re.sub(r"(?<!\\)\\[!,;: ]", "", s)                      # thin spaces (a matrix row break stays)
    s = s.replace("{,}", ",")                                      # 10{,}080 -> 10,080 (then 10080 below)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    # an answer written in inline / display math: \(x\) and \[x\] are x ("\(a\) or \(b\)" is not one span)
    delimited = re.fullmatch(r"\\\(((?:(?!\\[()]).)*)\\\)|\\\[((?:(?!\\[\[\]]).)*)\\\]", s, flags=re.DOTALL)
    if delimited:
        s = (delimited.group(1) if delimited.group(1) is not None else delimited.group(2)).strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s).replace("°", "")
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"_\{(\w+)\}", r"_\1", s)                          # 52_{8} -> 52_8 (a base subscript)
    set_braces = re.fullmatch(r"\\\{(.*)\\\}", s)
    if set_braces:
        s = set_braces.group(1)                                    # \{1,-2\} -> 1,-2 (a set, listed)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)          # \frac12
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)   # \frac{270}7
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)                # \frac3{4}
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)                  # \sqrt2
    s = re.sub(r"^[a-zA-Z]\\in", "", s)                          # x \in [-2,7] -> [-2,7]
    if re.fullmatch(r"[a-zA-Z]=[^=,]+", s) and not re.fullmatch(r"[a-zA-Z]=-?[a-zA-Z]", s):
        s = s.split("=", 1)[1]                                     # x=5 -> 5
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")                                     # 58,500
    s = re.sub(r"^(-?)\.(\d)", r"\g<1>0.\2", s)                    # .35 -> 0.35
    s = s.rstrip(".")
    option = re.fullmatch(r"\(?([A-E])\)?", s)
    return option.group(1) if option else s


_ALLOWED = re.compile(r"[0-9a-z+\-*/().^ ]*")
_FUNCTIONS = {"sqrt", "pi", "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "oo"}


def _to_sympy_text(s: str) -> str | None:
    t = s
    for _ in range(5):  # nested \frac / \sqrt
        t = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", t)
        t = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", t)
    t = t.replace("\\pi", " pi ").replace("\\infty", " oo ").replace("\\cdot", "*").replace("\\times", "*")
    for name in ("sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp"):
        t = t.replace("\\" + name, f" {name} ")
    t = t.replace("{", "(").replace("}", ")")
    if "\\" in t or not _ALLOWED.fullmatch(t) or len(t) > 120:
        return None
    words = set(re.findall(r"[a-z]{2,}", t))
    if not words <= _FUNCTIONS:
        return None
    # a decimal is the exact rational it writes (0.000067 is 67/10^6): no float rounding to compare through
    return re.sub(r"(\d*)\.(\d+)", lambda m: f"({int(m.group(1) + m.group(2))}/{10 ** len(m.group(2))})", t)


_POW = r"(?:\^|\*\*)"
_TOWER = re.compile(rf"{_POW}\s*(?:\([^()]*{_POW}|[\w.]+\s*{_POW})")  # a power in an exponent: 9^(9^9), 9^9^9
_EXPONENT = re.compile(rf"{_POW}\s*\(?\s*(\d+)")


def _too_big_to_evaluate(text: str) -> bool:
    """A power tower or an exponent over 1000: sympy would compute the number (a degenerate answer
    such as 2^(2^40) ran for minutes and stalled the whole evaluation). No MATH-500 answer has one."""
    return bool(_TOWER.search(text)) or any(int(e) > 1000 for e in _EXPONENT.findall(text))


def _sympy_equal(a: str, b: str) -> bool:
    ta, tb = _to_sympy_text(a), _to_sympy_text(b)
    if ta is None or tb is None or _too_big_to_evaluate(ta) or _too_big_to_evaluate(tb):
        return False
    try:
        import sympy
        from sympy.parsing.sympy_parser import (
            convert_xor,
            implicit_multiplication_application,
            parse_expr,
            standard_transformations,
        )

        transformations = standard_transformations + (implicit_multiplication_application, convert_xor)
        ea, eb = (parse_expr(t, transformations=transformations, evaluate=True) for t in (ta, tb))
        difference = sympy.simplify(ea - eb)
        if difference == 0:
            return True
        if difference.free_symbols:
            return False
        # equal values simplify cannot show equal (nested radicals): at 50 digits they differ by rounding
        # only, far below any real difference (1e-6 relative accepted 11111111110 for 11111111100)
        value = complex(difference.evalf(50))
        return abs(value) < 1e-30 * max(1.0, abs(complex(eb.evalf(50))))
    except Exception:  # noqa: BLE001 - anything sympy cannot read is simply "not shown equal"
        return False


def _split_top_level(s: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _matrix_entries(s: str) -> list[str] | None:
    match = re.fullmatch(r"\\begin\{[pb]matrix\}(.*)\\end\{[pb]matrix\}", s)
    return re.split(r"\\\\|&", match.group(1)) if match else None


def _list_items(s: str) -> list[str]:
    """The items of an answer listed without brackets ("1,-2", a set's "\\{1,-2\\}" once normalised), with an
    item ``a \\pm b`` as its two values ``a+b`` and ``a-b`` (a gold "3 \\pm 2\\sqrt{2}" is both roots): one item
    where it lists none."""
    items = []
    for part in _split_top_level(s):
        if part.count("\\pm") == 1:
            items += [part.replace("\\pm", "+"), part.replace("\\pm", "-")]
        else:
            items.append(part)
    return items


def _same_items(pa: list[str], pb: list[str]) -> bool:
    """Whether two lists hold equal items, in any order, each matched once ("1,-2" is "-2,1"; "1,1" is not
    "1,-1"). Equality is an equivalence, so taking the first unmatched equal item cannot miss a matching."""
    if len(pa) != len(pb):
        return False
    left = list(pb)
    for x in pa:
        found = next((i for i, y in enumerate(left) if math_equal(x, y)), None)
        if found is None:
            return False
        del left[found]
    return True


def math_equal(prediction: str, gold: str) -> bool:
    """Equal answers: the same normalised string, matrices / tuples / intervals equal part by part in order, lists
    without brackets ("Enter all the solutions, separated by commas") equal as multisets, else sympy's values."""
    a, b = normalize_math(prediction), normalize_math(gold)
    if a == b or (a.isalpha() and a.lower() == b.lower()):
        return True
    ma, mb = _matrix_entries(a), _matrix_entries(b)
    if ma is not None and mb is not None:
        return len(ma) == len(mb) and all(math_equal(x, y) for x, y in zip(ma, mb))
    brackets = re.compile(r"^([(\[])(.*)([)\]])$")
    ba, bb = brackets.match(a), brackets.match(b)
    if ba and bb and "," in a and "," in b:  # tuples and intervals: the brackets must match too, and the order
        if (ba.group(1), ba.group(3)) != (bb.group(1), bb.group(3)):
            return False
        pa, pb = _split_top_level(ba.group(2)), _split_top_level(bb.group(2))
        return len(pa) == len(pb) and all(math_equal(x, y) for x, y in zip(pa, pb))
    pa, pb = _list_items(a), _list_items(b)
    if len(pa) > 1 or len(pb) > 1:  # compared in order, "1, -2" for a gold "-2,1" was wrong
        return _same_items(pa, pb)
    return _sympy_equal(a, b)


_JOINER = re.compile(r"[\s$,;]*(?:(?:and|or|\\quad|\\qquad|\\text\{\s*(?:and|or)\s*\})[\s$,;]*)?(?:[a-zA-Z]\s*=\s*)?")


def _final_boxes(text: str) -> list[str]:
    """The boxes on the last line that has one, joined to its last box by nothing but a comma, 'and', 'or', \\quad or
    'x =' ("$\\boxed{-2}$ and $\\boxed{1}$."): all of them were joined, so "$\\boxed{-2}$ is extraneous, so the answer
    is $\\boxed{1}$" read the rejected -2 too and "..., i.e. $\\boxed{1,-2}$" read both roots twice. A last box that
    already lists its items is taken alone."""
    line = next((line for line in reversed(text.splitlines()) if _BOXED.search(line)), "")
    spans = []
    for m in _BOXED.finditer(line):
        content = _boxed_at(line, m.end())
        if content is None:
            continue
        end = m.end() + (len(content) + 2 if line[m.end():m.end() + 1] == "{" else len(content))
        spans.append((m.start(), end, content.strip()))
    run = spans[-1:]
    if run and len(_split_top_level(run[0][2])) > 1:  # "..., i.e. $\\boxed{1,-2}$" states the whole list
        return [run[0][2]]
    for prev in reversed(spans[:-1]):
        if not _JOINER.fullmatch(line[prev[1]:run[0][0]]):
            break
        run.insert(0, prev)
    return [c for _, _, c in run]


def score_math(output: str, gold: str) -> Score:
    """The boxed (or stated) answer against the gold; where the gold is a list ("-2,1", "3 \\pm 2\\sqrt{2}") and the
    output boxes each item on its own ("$\\boxed{-2}$ and $\\boxed{1}$"), those boxes as one list (the last box alone
    was read, one item of two). A gold of one item is still compared with the last box alone."""
    extracted = extract_math(output)
    boxes = _final_boxes(output)
    if len(_list_items(normalize_math(gold))) > 1 and len(boxes) > 1 and extracted == boxes[-1]:
        extracted = ", ".join(boxes)
    correct = extracted is not None and math_equal(extracted, gold)
    return Score(extracted=extracted, correct=correct, value=float(correct))
