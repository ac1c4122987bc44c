"""#18's adaptive draft length: the schedule's rule, SAFE runs that follow it, the answers it keeps,
and where its lengths are reported (stats, ``bench``, the eval summary). Toy members, fast."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shared_engine import EnsembleEngine, InvalidRequestError, policies
from shared_engine.bench import parse_method, run_bench
from shared_engine.cli import build_parser
from shared_engine.decoding import RequestState, request_members
from shared_engine.decoding.round import DraftBase, _draft, _drafter_prob
from shared_engine.evaluation import RunConfig, evaluate
from shared_engine.options import EngineOptions, validated
from shared_engine.policies import ADAPTIVE_STOP_BELOW, DraftSchedule
from shared_engine.sampling import Sampler
from tests.test_eval_runner import toy_bench
from tests.toy import registered_members, toy_member

PROMPT = "Tell me a story."


def disagreeing() -> list:
    """Two toy models with one vocabulary that disagree often: fusion changes many drafted tokens."""
    return [toy_member("drafts", "byte_level", seed=3), toy_member("checks", "byte_level", seed=4)]


def agreeing() -> list:
    """The same model twice: every draft stands whole."""
    return [toy_member("drafts", "byte_level", seed=3), toy_member("echo", "byte_level", seed=3)]


def length_rule_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adaptive schedule without its early stop (the toy drafters are unsure of every token, so
    with it every toy draft is one token long): the +2 / -1 rule alone decides the lengths."""
    monkeypatch.setattr(policies, "ADAPTIVE_STOP_BELOW", 0.0)


def sure_of_half(members: list) -> float:
    """A ``drafter_confidence`` that about half the drafter's tokens clear on PROMPT."""
    probe = EnsembleEngine(members, method="safe", drafter_confidence=0.99, max_new_tokens=60).generate(
        PROMPT, keep_events=True)
    probs = sorted(p.probs[members[0].name] for e in probe.events if e.type == "verify" for p in e.positions
                   if p.probs)
    return probs[len(probs) // 2]


def recorded_rounds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """What every round tells the schedule: (the length it drafted, whether its draft stood whole)."""
    calls: list[tuple[int, bool]] = []
    after = DraftSchedule.after

    def spy(self: DraftSchedule, length: int, kept_whole: bool) -> int:
        calls.append((length, kept_whole))
        return after(self, length, kept_whole)

    monkeypatch.setattr(DraftSchedule, "after", spy)
    return calls


# -- the rule -----------------------------------------------------------------------------------

def test_the_adaptive_draft_grows_on_whole_rounds_shrinks_after_a_change_and_stays_in_bounds() -> None:
    adaptive = DraftSchedule.adaptive(5, longest=9)
    assert adaptive.start == 5
    assert adaptive.after(5, kept_whole=True) == 7  # +2
    assert adaptive.after(5, kept_whole=False) == 4  # -1
    assert adaptive.after(8, kept_whole=True) == 9 and adaptive.after(9, kept_whole=True) == 9  # the longest
    assert adaptive.after(1, kept_whole=False) == 1  # the shortest
    length, seen = adaptive.start, []
    for kept_whole in [True] * 4 + [False] * 12 + [True, False] * 3:
        length = adaptive.after(length, kept_whole)
        seen.append(length)
    assert seen[:4] == [7, 9, 9, 9] and seen[4:16] == [8, 7, 6, 5, 4, 3, 2, 1, 1, 1, 1, 1]
    assert seen[16:] == [3, 2, 4, 3, 5, 4]  # +2 / -1 alternating: drifts up by one per pair
    fixed = DraftSchedule.fixed(5)
    assert {fixed.after(5, kept_whole) for kept_whole in (True, False)} == {5}
    with pytest.raises(ValueError, match="within"):
        DraftSchedule.adaptive(10, longest=9)
    # the early stop: drafter_confidence's bar where there is one, else Hugging Face's default
    assert (fixed.stop_below, adaptive.stop_below) == (None, ADAPTIVE_STOP_BELOW)
    assert DraftSchedule.adaptive(5, 9, drafter_confidence=0.5).stop_below == 0.5


def test_an_adaptive_draft_ends_after_the_first_token_the_drafter_is_unsure_of() -> None:
    drafter = toy_member("drafts", "byte_level", seed=3)

    def fresh() -> RequestState:
        return RequestState(request_members([drafter], ["drafts"], [drafter.new_session()],
                                            [drafter.prompt_ids([{"role": "user", "content": PROMPT}])]),
                            max_new_tokens=100)

    probe = fresh()
    full = _draft(probe, DraftBase.of(probe), 12, Sampler(0.0), stop_below=None)
    probs = [_drafter_prob(probe, token, row) for token, row in zip(full.ids, full.logits)]
    bar = (probs[0] + max(p for p in probs if p < probs[0])) / 2  # the first token clears it, some do not
    first_unsure = next(i for i, p in enumerate(probs) if p < bar)
    assert 1 <= first_unsure < len(full.ids) - 1
    stopped = _draft(state := fresh(), DraftBase.of(state), 12, Sampler(0.0), stop_below=bar)
    assert stopped.ids == full.ids[:first_unsure + 1]  # up to and with the unsure token, nothing past it
    assert _draft(state := fresh(), DraftBase.of(state), 12, Sampler(0.0), stop_below=0.0).ids == full.ids


def test_draft_schedule_options_are_validated_with_a_clear_error() -> None:
    with pytest.raises(InvalidRequestError, match=r"draft_length \(20\) exceeds max_draft_length \(16\).*"
                                                  r"raise max_draft_length, or .*draft_schedule='fixed'"):
        validated(EngineOptions, draft_length=20)  # adaptive, the default: the error says what to do
    assert validated(EngineOptions, draft_length=20, max_draft_length=24).max_draft_length == 24
    with pytest.raises(InvalidRequestError, match="draft_schedule"):
        validated(EngineOptions, draft_schedule="sometimes")
    assert validated(EngineOptions, draft_schedule="fixed", draft_length=20).draft_length == 20  # adaptive's bound
    # the default: the same answers as SAFE's fixed gamma on GSM8K, fewer drafter forwards (docs/speed.md)
    assert validated(EngineOptions).draft_schedule == "adaptive"


# -- SAFE runs ----------------------------------------------------------------------------------

def test_an_adaptive_safe_run_drafts_the_lengths_the_rule_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    length_rule_only(monkeypatch)
    rounds = recorded_rounds(monkeypatch)
    result = EnsembleEngine(disagreeing(), method="safe", draft_schedule="adaptive", drafter_confidence=None,
                            drafter_weight=1.0, max_new_tokens=60,
                            ).generate(PROMPT)  # the paper's rule and weights: changes that shrink drafts
    stats = result.stats
    assert len(rounds) == stats.rounds and rounds[0][0] == 5
    assert sum(not whole for _, whole in rounds) == stats.changed_tokens > 0  # each change ends its round
    for (length, whole), (following, _) in zip(rounds, rounds[1:]):
        assert following == min(16, max(1, length + (2 if whole else -1)))
    assert stats.draft_lengths == Counter(length for length, _ in rounds)
    assert len(stats.draft_lengths) >= 3 and min(stats.draft_lengths) == 1  # varied, down to the shortest


def test_drafts_that_always_stand_grow_to_the_longest(monkeypatch: pytest.MonkeyPatch) -> None:
    length_rule_only(monkeypatch)

    def run(**options: object) -> object:  # the paper's rule: the stop is ADAPTIVE_STOP_BELOW, patched off
        return EnsembleEngine(agreeing(), method="safe", max_new_tokens=60, drafter_confidence=None,
                              **options).generate(PROMPT)

    fixed, adaptive = run(draft_schedule="fixed"), run(draft_schedule="adaptive", max_draft_length=9)
    assert fixed.stats.draft_lengths == {5: 12}
    assert adaptive.stats.draft_lengths == {5: 1, 7: 1, 9: 6}  # 5 + 7 + 6 x 9 >= 60 (the last one cut)
    assert adaptive.text == fixed.text
    assert adaptive.stats.forward_passes["echo"] == 8 < fixed.stats.forward_passes["echo"] == 12


@pytest.mark.parametrize("variant", ["as-shipped", "length-rule-only", "drafter-confidence"])
def test_greedy_answers_equal_the_fixed_schedules_when_verifiers_share_the_drafters_vocabulary(
        variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact where every verifier reads the drafter's own ids: each position's decision (consensus,
    fusion, the fused choice) depends on the ids before it alone, not on where a round's draft ends.
    Across vocabularies it need not hold exactly: a verifier re-tokenizes answer + draft, so at a
    draft's last position its own next token is read from text that ends there, and a draft ending
    inside a word can change that one position's consensus check (no toy pair tried showed it)."""
    if variant == "length-rule-only":
        length_rule_only(monkeypatch)
    drafter_confidence = sure_of_half(disagreeing()) if variant == "drafter-confidence" else None

    def run(schedule: str) -> object:
        return EnsembleEngine(disagreeing(), method="safe", draft_schedule=schedule, max_new_tokens=60,
                              drafter_confidence=drafter_confidence).generate(PROMPT, keep_events=True)

    fixed, adaptive = run("fixed"), run("adaptive")
    assert adaptive.stats.rounds != fixed.stats.rounds  # the drafts did end elsewhere
    assert adaptive.text == fixed.text
    assert [(e.position, e.chosen) for e in adaptive.events if e.type == "ensemble"] == \
        [(e.position, e.chosen) for e in fixed.events if e.type == "ensemble"]


def test_with_drafter_confidence_an_adaptive_draft_throws_nothing_away() -> None:
    """Only a token below ``drafter_confidence`` can be fused, and the adaptive draft ends at the
    first such token: a change replaces the last drafted token, no drafter work is lost."""
    members = disagreeing()
    bar = sure_of_half(members)

    def run(schedule: str) -> object:
        return EnsembleEngine(members, method="safe", draft_schedule=schedule, drafter_confidence=bar,
                              max_new_tokens=60).generate(PROMPT)

    fixed, adaptive = run("fixed"), run("adaptive")
    assert adaptive.stats.changed_tokens > 0 and adaptive.text == fixed.text
    fixed_waste, adaptive_waste = (r.stats.drafted_tokens - r.stats.accepted_tokens - r.stats.changed_tokens
                                   for r in (fixed, adaptive))
    assert adaptive_waste <= 1 < fixed_waste  # at most a drafted EOS that ended the answer
    assert adaptive.stats.forward_passes["drafts"] < fixed.stats.forward_passes["drafts"]


# -- where the lengths are reported ---------------------------------------------------------------

def bench_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "--models", "drafts,checks", *flags])


def test_a_bench_method_entry_can_change_engine_flags() -> None:
    args = bench_args("--drafter-confidence", "0.3")
    method, changed = parse_method("safe:draft-schedule=fixed:max_draft_length=8", args)
    assert (method, changed.draft_schedule, changed.max_draft_length) == ("safe", "fixed", 8)
    assert changed.drafter_confidence == 0.3 and changed.models == args.models  # the rest as given
    assert (args.draft_schedule, args.max_draft_length) == ("adaptive", 16)  # the run's own flags are untouched
    for bad in ("safe:draft-schedule=sometimes", "safe:nonsense=1", "safe:adaptive"):
        with pytest.raises(SystemExit):
            parse_method(bad, args)


def test_bench_reports_draft_lengths_and_compares_a_variant_with_its_method() -> None:
    with registered_members(disagreeing()):
        results = run_bench(bench_args("--prompts", "1", "--max-new-tokens", "24",
                                       "--methods", "safe,safe:draft-schedule=fixed"))
    adaptive, fixed = results["methods"]["safe"], results["methods"]["safe:draft-schedule=fixed"]
    assert fixed["mean_draft_length"] == 5.0 and fixed["draft_lengths"] == {5: fixed["draft_lengths"][5]}
    assert len(adaptive["draft_lengths"]) > 1 and adaptive["mean_draft_length"] != 5.0
    assert results["draft_schedule"] == "adaptive"
    assert fixed["same_answers_as_safe"] is True and fixed["vs_safe"] > 0


async def test_the_eval_summary_has_the_mean_draft_length(tmp_path: Path) -> None:
    engine = EnsembleEngine(disagreeing(), method="safe", draft_schedule="adaptive")
    config = RunConfig(bench="toy", models=["drafts", "checks"], method="safe", max_new_tokens=24)
    summary = await evaluate(engine, toy_bench(tmp_path, questions=2), config, tmp_path, progress=False)
    assert 1 <= summary["mean_draft_length"] <= 16 and summary["mean_draft_length"] != 5


def test_bench_methods_take_turns_prompt_by_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every method answers a prompt before the next prompt, each first in turn (a drift of the
    machine's speed falls on all alike), and a variant gets its per-prompt ratio to its method."""
    from shared_engine import EnsembleEngine as Engine

    calls: list[tuple[str, str]] = []
    generate = Engine.generate

    def recording(self: Any, prompt: Any, **params: Any) -> Any:
        if prompt != "Say hi.":  # not the warm-up
            calls.append((f"{self.options.method}/{self.options.draft_schedule}", prompt[:20]))
        return generate(self, prompt, **params)

    monkeypatch.setattr(Engine, "generate", recording)
    with registered_members(disagreeing()):
        results = run_bench(bench_args("--prompts", "2", "--repeats", "2", "--max-new-tokens", "12",
                                       "--methods", "single,safe:draft-schedule=fixed,safe"))
    methods = ["single/adaptive", "safe/fixed", "safe/adaptive"]  # single drafts alone whatever the schedule
    assert len(calls) == 2 * 2 * 3
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert [[m for m, _ in r] for r in rounds] == [methods[k:] + methods[:k] for k in (0, 1, 2, 0)]
    assert all(len({p for _, p in r}) == 1 for r in rounds) and rounds[0][0][1] != rounds[2][0][1]
    paired = results["methods"]["safe:draft-schedule=fixed"]["per_prompt_vs_safe"]
    assert paired["prompts"] == 2 and paired["min"] <= paired["median"] <= paired["max"]
    assert results["repeats"] == 2 and results["methods"]["safe"]["tokens"] > 0
    assert results["methods"]["safe"]["per_prompt_vs_single"]["prompts"] == 2
    assert "per_prompt_vs_single" not in results["methods"]["single"]
    with pytest.raises(SystemExit):
        bench_args("--repeats", "0")


def test_bench_answers_an_eval_benchmarks_prompts_as_eval_asks_them(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """``--prompts-from flores:de-en``: speed on a translation workload (fused far more often than a
    GSM8K answer), with the benchmark's own system prompt, its first records in order and its stops."""
    import json

    from shared_engine import EnsembleEngine as Engine

    (tmp_path / "flores").mkdir()
    (tmp_path / "prompts" / "adafuse").mkdir(parents=True)
    (tmp_path / "prompts" / "adafuse" / "flores_deu2en_prompt.txt").write_text(
        "Translate the following German sentences into English.\n\nNow, translate the following sentences:")
    sentences = ["Guten Morgen.", "Wie geht es dir?", "Das Haus ist rot."]
    (tmp_path / "flores" / "de-en.jsonl").write_text("".join(
        json.dumps({"id": i, "question": q, "answer": "x"}) + "\n" for i, q in enumerate(sentences)))
    asked: list[tuple[Any, Any]] = []
    generate = Engine.generate

    def recording(self: Any, prompt: Any, **params: Any) -> Any:
        if prompt != "Say hi.":
            asked.append((prompt, params.get("stop")))
        return generate(self, prompt, **params)

    monkeypatch.setattr(Engine, "generate", recording)
    with registered_members(disagreeing()):
        results = run_bench(bench_args("--prompts", "2", "--max-new-tokens", "8", "--methods", "single",
                                       "--prompts-from", "flores:de-en", "--data", str(tmp_path)))
    assert results["prompts_from"] == "flores:de-en" and results["prompts"] == 2
    assert results["data"] == str(tmp_path / "flores" / "de-en.jsonl")
    assert [p[-1]["content"] for p, _ in asked] == sentences[:2]
    assert all(p[0]["role"] == "system" and p[0]["content"].startswith("Translate the following German")
               for p, _ in asked)
    with pytest.raises(InvalidRequestError, match="unknown FLORES pair"):
        run_bench(bench_args("--prompts-from", "flores:de-xx", "--data", str(tmp_path)))
    with pytest.raises(InvalidRequestError, match="unknown benchmark 'poetry'"):
        run_bench(bench_args("--prompts-from", "poetry"))


def test_bench_passes_a_benchmarks_stop_strings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A few-shot benchmark's answers stop where its next exemplar question would start, as in eval."""
    import json

    from shared_engine import EnsembleEngine as Engine

    data = tmp_path / "triviaqa.jsonl"
    data.write_text(json.dumps({"question": "Which planet is red?", "answer": ["Mars"]}) + "\n")
    prompt_file = tmp_path / "triviaqa_prompt.txt"
    prompt_file.write_text("Answer the question.\n\nExamples:\nQuestion: Sky colour?\nAnswer: Blue\n")
    monkeypatch.setattr("shared_engine.evaluation.benchmarks._aux", lambda main, beside, default: prompt_file)
    stops: list[Any] = []
    generate = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, prompt, **params: (
        stops.append(params.get("stop")), generate(self, prompt, **params))[1])
    with registered_members(disagreeing()):
        results = run_bench(bench_args("--prompts", "1", "--max-new-tokens", "6", "--methods", "single",
                                       "--prompts-from", "triviaqa", "--data", str(data)))
    assert results["stop"] == ["\nQuestion:"] and stops[-1] == ["\nQuestion:"]
    with registered_members(disagreeing()):
        default = run_bench(bench_args("--prompts", "1", "--max-new-tokens", "6", "--methods", "single"))
    assert default["prompts_from"] == "gsm8k-cot" and default["stop"] == []
