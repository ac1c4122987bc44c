# ruff: noqa: E501  (a table of model outputs, each on one line)
"""Review of the multiple-choice / BBH rules of bcd0357 (review o): each rule read answers wrong that the reader
before it read right. A model-written turn line ("Question: ...") cut the reasoning before its real conclusion
(the part before the turn counts only where it states an answer outright: a bare one, or a cue stating a letter,
yes/no or a number, not one qualified by if/when/unless); a verdict list calling two options right discarded the
conclusion after it ("So the false statement is option C."); a first line turning to other letters and coming back
to its own ("(C). Actually, A is correct and B is correct, so it's C."); "D is correct too" following from the
others ("Since A is right and B is right, D is correct too": D is "Both"/"All of the above"); "... analysis
suggests B" read over an earlier "C is correct"; a BBH "Answer:\nOption A: ..." over a list of options or a
correction after it. FIXED: each read wrong at bcd0357 and right now; KEPT: read right both before and after."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, score_bbh

FIXED = [
    ('bbh', 'Let me recheck (B).\nQuestion: Which sentence has the correct adjective order?\nThe order is opinion, size, age, shape, color, origin, material, purpose. (A) follows it. So the answer is (A).', '(A)', 'A'),
    ('bbh', "Yes, let's restate the problem.\nQuestion: Did the black wire cause the short circuit?\nThe red wire was also touching the battery, so a typical person would say the black wire alone did not cause it. So the answer is No.", 'No', 'No'),
    ('bbh', 'Sure! Here is the answer is broken into steps.\nQuestion: Sort the following words alphabetically: List: syndrome therefrom\nStep 1: s < t. So the answer is syndrome therefrom.', 'syndrome therefrom', 'syndrome therefrom'),
    ('bbh', "Let's think step by step. The answer is the last closing bracket sequence.\nQuestion: Complete the rest of the sequence: [ [\nWe need to close two brackets. So the answer is ] ].", '] ]', '] ]'),
    ('bbh', '**Step 1**: Alice has the red ball (A).\n\nQuestion: At the end, who has the red ball?\n\nAfter swaps: Alice-blue, Bob-red. So the answer is (B).', '(B)', 'B'),
    ('bbh', 'We start with (A) Ulysses for Bob.\nQuestion: what does Bob have at the end?\nAfter Claire and Bob swap, Bob has Frankenstein. So the answer is (B).', '(B)', 'B'),
    ('bbh', "Answer: Let's think step by step.\nQuestion: Sort the following words alphabetically: List: syndrome therefrom\nSo the answer is syndrome therefrom.", 'syndrome therefrom', 'syndrome therefrom'),
    ('bbh', 'The answer is (A) if we count only the first swap.\nQuestion: but at the end?\nAfter all swaps, Bob has Frankenstein. So the answer is (B).', '(B)', 'B'),
    ('bbh', 'Human: this is my reasoning, (A) seems likely\nAssistant: Let me check. So the answer is (B).', '(B)', 'B'),
    ('mc', "Let's evaluate each option:\n\n- Option A: Water boils at 100°C at sea level - correct\n- Option B: Ice is less dense than water - correct\n- Option C: The sun orbits the earth - incorrect\n\nSo the false statement is option C.", 'ABCD', 'C'),
    ('mc', "Option A: Paris is the capital of France. This is correct.\nOption B: Paris, the capital since 508 AD. This is correct.\nOption C: Lyon. Wrong.\n\nI'll go with option B.", 'ABCD', 'B'),
    ('mc', '### Option A: Mercury\nThis statement is correct.\n### Option B: Venus\nThis statement is correct.\n### Option C: Pluto\nThis statement is incorrect.\n\n### Conclusion\nThe false statement is Option C.', 'ABCD', 'C'),
    ('mc', '**Option A**: correct.\n**Option B**: correct.\n**Option D**: incorrect, the others are true.\n\nHence the exception is option D.', 'ABCD', 'D'),
    ('mc', '1. Option A: Mitochondria produce ATP - correct\n2. Option B: Ribosomes make proteins - correct\n3. Option C: The nucleus stores DNA - correct\n4. Option D: Chloroplasts are in animal cells - incorrect\n\nThe question asks which is NOT true, so the answer would be option D', 'ABCD', 'D'),
    ('mc', "(C). Actually, A is correct and B is correct, so it's C.", 'ABCD', 'C'),
    ('mc', 'C. But wait, A is correct and B is correct, so both - C.', 'ABCD', 'C'),
    ('mc', 'A. Wait, no. B is correct. No wait, A.', 'ABCD', 'A'),
    ('mc', 'Since A is right and B is right, D is correct too.', 'ABCD', 'D'),
    ('mc', 'A is true for the first sentence. Since A is true, D is correct too.', 'ABCD', 'D'),
    ('mc', 'C is correct. A naive analysis suggests B. But that ignores friction.', 'ABCD', 'C'),
    ('mc', 'C is correct. At first glance the evidence suggests A.\nHowever, the fossil record rules this out.', 'ABCD', 'C'),
    ('mc', "Option C is the answer. The textbook's reasoning says D.", 'ABCD', 'C'),
    ('mc', "B is correct.\n\nWhy not the others? The evidence for A is weak; the evidence favours B.\nC's logic says D.", 'ABCD', 'B'),
    ('bbh', 'The final answer is:\n\nOption B: Frankenstein\nOption C: Lolita', '(B)', None),
]

KEPT = [
    ('bbh', 'No problem! Let me work through it.\nQuestion: Is the argument valid?\nPremise 1 ... Premise 2 ... The conclusion follows. So the answer is valid.', 'valid', 'valid'),
    ('bbh', 'The answer is based on counting each instrument.\nQuestion: How many musical instruments do I have?\nflute 1, piano 2, trombone 3, violin 4, accordion 5, clarinet 6, drum 7, trumpet 8. So the answer is 8.', '8', '8'),
    ('bbh', 'So the answer is (A).\n\nQ: Which sentence has the correct adjective order? ... So the answer is (B).', '(A)', 'A'),
    ('bbh', '(A)\n\nUser: next question\nAssistant: So the answer is (B).', '(A)', 'A'),
    ('bbh', "Q: Today is Christmas Eve of 1937. What is the date tomorrow?\nA: Let's think step by step. Tomorrow is 12/25/1937. So the answer is (B).", '(B)', 'B'),
    ('bbh', "Let's think step by step.\nQ: Today is Christmas Eve of 1937 (12/24/1937). Options: (A) 12/11/1937\nA: Tomorrow is 12/25/1937. So the answer is (B).", '(B)', 'B'),
    ('bbh', 'Let me restate. Today is 12/24/1937 (D is 12/04).\nQuestion: What is the date tomorrow?\nTomorrow is 12/25/1937, so the answer is (B).', '(B)', 'B'),
    ('bbh', 'We check option (C) first.\nQuestion: Find a movie similar to Batman, The Mask...\nThese are all 1990s hits; The Lion King fits. So the answer is (C).', '(C)', 'C'),
    ('bbh', 'Option (A) has the order size age color origin.\nQuestion: Which is correct?\nSo the answer is (B).', '(B)', 'B'),
    ('bbh', "Answer: Let's think step by step.\nQuestion: How many musical instruments do I have?\nThere are 8. So the answer is 8.", '8', '8'),
    ('bbh', "The answer is not obvious. Let's see.\nQuestion: Did the black wire cause the short circuit?\nSo the answer is No.", 'No', 'No'),
    ('bbh', "Invalid premises aside, let's look.\nQuestion: Is the argument valid?\nIt is. So the answer is valid.", 'valid', 'valid'),
    ('bbh', 'No\n\nQuestion: Is the following sentence plausible? "Joao Moutinho caught the screen pass"\nSo the answer is no.', 'no', 'no'),
    ('bbh', "True or false: let's evaluate.\nQuestion: not ( True ) and ( True ) is\nnot True = False. False and True = False. So the answer is False.", 'False', 'False'),
    ('mc', '- Option A: Photosynthesis converts light to chemical energy - correct\n- Option B: Light energy is absorbed - also correct, but less complete\n- Option C: incorrect\n\nTherefore, option A.', 'ABCD', 'A'),
    ('mc', '- Option A: Light energy is converted to chemical energy. It is correct.\n- Option B: Light is absorbed. It is correct as well, but less complete.\n\nThe most complete one is option A.', 'ABCD', 'A'),
    ('mc', 'Option (A): correct - it describes the process.\nOption (B): correct too, but less complete.\nOption (C): incorrect.\nOption (D): incorrect.\n\nSo I choose option (A).', 'ABCD', 'A'),
    ('mc', '### Option A: Mercury\nMercury is the closest planet, so it is correct.\n\n### Option B: Venus\nVenus is the hottest.\n\nFinal choice: option A', 'ABCD', 'A'),
    ('mc', '### Option B: Venus\nVenus is the right answer.', 'ABCD', 'B'),
    ('mc', '(A). Wait, no. (C) is correct.', 'ABCD', 'C'),
    ('mc', '(B). Wait, let me double-check: A is wrong, C is wrong, D is wrong. B is correct.', 'ABCD', 'B'),
    ('mc', '(B). Wait, is C correct? No. B is correct.', 'ABCD', 'B'),
    ('mc', '(B) Wait, no - option C is the best answer if we ignore friction, but friction matters here, so (B).', 'ABCD', 'B'),
    ('mc', '(A). Wait, no, D is correct. Hmm, no, actually A is correct.', 'ABCD', 'A'),
    ('mc', '(A) Wait, D is correct? Let me re-read. Yes, (A).', 'ABCD', 'A'),
    ('mc', 'B. However, D is correct for metals; for this case B.', 'ABCD', 'B'),
    ('mc', "(D). Actually it's D. C is correct too but D is more complete.", 'ABCD', 'D'),
    ('mc', "(A) But wait, I'd say B. Hmm, no. Final: (A).", 'ABCD', 'A'),
    ('mc', 'B is plausible, but C is correct too.', 'ABCD', None),
    ('mc', 'Statement A is correct, so option C ("Both A and B") - C is correct too? No: B is false. A is correct.', 'ABCD', 'A'),
    ('mc', 'B is wrong. (A) is incorrect. (C) is possible, and D is correct too.', 'ABCD', None),
    ('mc', 'Option A is right, and C is correct as well as the most complete.', 'ABCD', None),
    ('mc', 'If A is correct, then C is correct too. A is correct, so C is the answer.', 'ABCD', 'C'),
    ('mc', 'A is not correct. B is not right either. C is right. D is correct too? No, D is wrong. So C is correct.', 'ABCD', 'C'),
    ('mc', 'The first clause (A) is correct. Therefore C is correct too, since C includes A.', 'ABCD', 'C'),
    ('mc', 'Logic says B.', 'ABCD', 'B'),
    ('mc', 'Nothing in the evidence points to D.\nC is correct.', 'ABCD', 'C'),
    ('mc', "The student's reasoning says A. That is a common mistake; the correct response is (C) because C is correct.", 'ABCD', 'C'),
    ('mc', 'C is the best answer. My first analysis suggested B.', 'ABCD', 'C'),
    ('bbh', 'Final Answer:\nOption A: midsize old grey Brazilian sweater', '(A)', 'A'),
    ('bbh', "**Answer:**\n\nOption A: The patient had a skin condition\nOption B: The specialist had a skin condition\nOption C: Ambiguous\n\nThe pronoun 'he' refers to the patient.", '(A)', 'A'),
    ('bbh', "Let's find the answer:\nOption (A) - Patrick: after the first swap Alice has Sam.\nOption (B) - Sam: ...\nSo Alice ends with Patrick.", '(A)', 'A'),
    ('bbh', 'The answer is:\nOption (C): The Lion King - it fits the 90s blockbuster pattern', '(C)', 'C'),
    ('bbh', 'Final Answer:\nOption B: The quail is the second from the left\nbecause the quail is left of the falcon.', '(B)', 'B'),
    ('bbh', 'Answer:\n- Option (A): midsize old grey Brazilian sweater - this follows size-age-color-origin\n- Option (B): midsize grey Brazilian old sweater - age is misplaced\n\nSo the answer is (A).', '(A)', 'A'),
    ('bbh', 'To find the answer:\nOption A: humorous? ruin man changes rain to ruin - yes.', '(A)', 'A'),
    ('bbh', 'Answer: Option A: Patrick', '(A)', 'A'),
    ('mc', "### Option A: Mercury\nCorrect? Let's check: Mercury is the closest planet.\n\n### Option B: Venus\nVenus is the hottest.\n\nSo option A.", 'ABCD', 'A'),
    ('mc', '### Option A: True statement\nThe statement is correct.\n\n### Option B\nThe statement is incorrect.\n\nThe question asks for the incorrect one, so we pick option B.', 'ABCD', 'B'),
    ('mc', '## Analysis\n### Option A\nIt is correct.\n### Option B\nIt is correct.\n### Option C\nIt is wrong.\n### Option D\nIt is correct.\n\n## Answer\nThe exception is option C', 'ABCD', 'C'),
    ('mc', '**(B)**. Wait, let me verify. (B) is correct since the others are wrong: (A) is wrong, (C) is wrong.', 'ABCD', 'B'),
    ('mc', '(A) Wait no, it is (A), because (B) is the answer only for gases.', 'ABCD', 'A'),
    ('mc', 'A. No, hold on, B is the answer many pick but A is right.', 'ABCD', 'A'),
    ('mc', '(C). Actually, option D is correct for the second part, so C overall.', 'ABCD', 'C'),
]


def _read(kind: str, output: str, arg: str) -> str | None:
    return extract_choice(output, arg) if kind == "mc" else score_bbh(output, arg).extracted


def _same(read: str | None, right: str | None) -> bool:
    return read == right or (read is not None and right is not None and read.lower() == right.lower())


@pytest.mark.parametrize(("kind", "output", "arg", "right"), FIXED + KEPT)
def test_reviewed_readings(kind: str, output: str, arg: str, right: str | None) -> None:
    assert _same(_read(kind, output, arg), right)
