"""The eval runner on toy members (fast): JSONL as it goes, resume after an interruption, config
checks, failures, the summary's interval, the CLI wiring and ``eval compare``'s table and plots."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from shared_engine import EnsembleEngine, InvalidRequestError
from shared_engine.cli import build_parser
from shared_engine.evaluation import RunConfig, Sample, evaluate, get_benchmark, summarize, wilson_interval
from shared_engine.evaluation.compare import compare_runs
from shared_engine.evaluation.datasets import Dataset, Record
from shared_engine.evaluation.runner import SAMPLES, SUMMARY
from shared_engine.evaluation.scoring import score_number
from shared_engine.options import METHODS
from tests.benchdata import needs_data
from tests.eval_files import gsm8k_file
from tests.toy import toy_member

TIMING = {"tokens_per_s", "elapsed_s", "seconds_per_question", "mean_time_to_first_token_s",
          "mean_drafter_choice_s"}


def toy_bench(tmp_path: Path, questions: int = 3):  # noqa: ANN201 - a Benchmark
    """GSM8K-style records short enough for the toy models' 512-token window."""
    records = [Record(id=str(i), question=f"Q: What is {i} + {i}?", answers=[str(2 * i)]) for i in range(questions)]
    data = Dataset(name="toy", source="memory", records=records)
    return dataclasses.replace(
        get_benchmark("gsm8k", data=str(_gsm8k_file(tmp_path))), name="toy", load=lambda _path: data,
        messages=lambda r: [{"role": "user", "content": r.question}],
        score=lambda out, r, finish=None: score_number(out, r.answers[0]))


def _gsm8k_file(tmp_path: Path) -> Path:
    return gsm8k_file(tmp_path, [("1 + 1?", "2")])


def engine() -> EnsembleEngine:
    return EnsembleEngine([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)],
                          method="safe")


def config(method: str = "safe", max_new_tokens: int = 12) -> RunConfig:
    return RunConfig(bench="toy", models=["a", "b"], method=method, max_new_tokens=max_new_tokens)


def _comparable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in TIMING}


def _without_timing(sample: dict) -> dict:
    timing = ("elapsed_s", "tokens_per_s", "time_to_first_token_s", "draft_s", "verify_s", "drafter_choice_s")
    stats = {k: v for k, v in sample["stats"].items() if k not in timing}
    return {**sample, "stats": stats}


async def test_resume_after_an_interruption_gives_the_uninterrupted_result(tmp_path: Path) -> None:
    bench = toy_bench(tmp_path)
    full = await evaluate(engine(), bench, config(), tmp_path / "full", progress=False)

    class Interrupted(Exception):
        pass

    def crash_after_two(sample) -> None:  # noqa: ANN001
        if sample.id == "1":
            raise Interrupted

    out = tmp_path / "resumed"
    with pytest.raises(Interrupted):
        await evaluate(engine(), bench, config(), out, progress=False, on_sample=crash_after_two)
    assert len((out / SAMPLES).read_text().splitlines()) == 2     # both written before the crash
    with open(out / SAMPLES, "a") as f:
        f.write('{"id": "2", "prompt": [{"ro')                       # a line cut off mid-write
    answered = []
    resumed = await evaluate(engine(), bench, config(), out, resume=True, progress=False,
                             on_sample=lambda s: answered.append(s.id))
    assert answered == ["2"]                                        # only the missing question ran
    assert _comparable(resumed) == _comparable(full)
    assert resumed["n"] == 3 and resumed["method"] == "safe" and resumed["prompt_version"]
    lines = [json.loads(x) for x in (out / SAMPLES).read_text().splitlines()]
    expected = [json.loads(x) for x in (tmp_path / "full" / SAMPLES).read_text().splitlines()]
    assert [_without_timing(x) for x in lines] == [_without_timing(x) for x in expected]
    assert json.loads((out / SUMMARY).read_text()) == resumed


async def test_runs_refuse_to_mix(tmp_path: Path) -> None:
    bench = toy_bench(tmp_path, questions=1)
    await evaluate(engine(), bench, config(), tmp_path, progress=False)
    with pytest.raises(InvalidRequestError, match="--resume"):
        await evaluate(engine(), bench, config(), tmp_path, progress=False)
    with pytest.raises(InvalidRequestError, match="max_new_tokens"):
        await evaluate(engine(), bench, config(max_new_tokens=5), tmp_path, resume=True, progress=False)
    # an option added later, at its default
    newer = config().model_copy(update={"engine_options": {"draft_length": 5}})
    await evaluate(engine(), bench, newer, tmp_path, resume=True, progress=False)
    changed = config().model_copy(update={"engine_options": {"draft_length": 4}})
    with pytest.raises(InvalidRequestError, match="draft_length"):
        await evaluate(engine(), bench, changed, tmp_path, resume=True, progress=False)


async def test_a_resume_mismatch_names_only_the_engine_options_that_differ(tmp_path: Path) -> None:
    """It printed both whole engine_options dicts (~1,000 characters) around the one changed key."""
    bench = toy_bench(tmp_path, questions=1)
    options = engine().options.model_dump()
    ran = config().model_copy(update={"engine_options": options})
    await evaluate(engine(), bench, ran, tmp_path, progress=False)
    changed = config().model_copy(update={"engine_options": {**options, "draft_length": 4}})
    with pytest.raises(InvalidRequestError) as info:
        await evaluate(engine(), bench, changed, tmp_path, resume=True, progress=False)
    assert str(info.value).endswith(f"{{'engine_options': {{'draft_length': ({options['draft_length']}, 4)}}}}")


async def test_a_run_with_no_deadline_resumes(tmp_path: Path) -> None:
    """A members file's ``http: {timeout_s: .inf}`` (no deadline) was written to config.json as null,
    which reads back as the backend's default: every resume of such a run was refused."""
    bench = toy_bench(tmp_path, questions=2)
    no_deadline = {"llamacpp:http://127.0.0.1:9": {"http": {"timeout_s": math.inf}}}
    ran = config().model_copy(update={"member_options": no_deadline})
    await evaluate(engine(), bench, ran, tmp_path, progress=False, limit=1)
    await evaluate(engine(), bench, ran, tmp_path, resume=True, progress=False)
    assert len((tmp_path / SAMPLES).read_text().splitlines()) == 2


async def test_resume_asks_again_what_failed_for_a_passing_reason(tmp_path: Path) -> None:
    """A member's timeout is not the question's fault: resume asks it again (its new answer is its
    only line). A request error (a prompt too long) would fail again the same way: it stays."""
    bench = toy_bench(tmp_path)
    full = await evaluate(engine(), bench, config(), tmp_path / "full", progress=False)
    out = tmp_path / "failed"
    await evaluate(engine(), bench, config(), out, progress=False)
    lines = [json.loads(x) for x in (out / SAMPLES).read_text().splitlines()]
    failed = {"output": "", "extracted": None, "correct": False, "value": 0.0, "finish_reason": "error",
              "stats": None}
    lines[0].update(failed, error="MemberError: member 'a' at http://x: POST /completion failed after 3 attempt(s)")
    lines[2].update(failed, error="ContextLengthError: the prompt has 600 tokens; member 'a' holds 512")
    (out / SAMPLES).write_text("".join(json.dumps(x) + "\n" for x in lines))
    answered = []
    resumed = await evaluate(engine(), bench, config(), out, resume=True, progress=False,
                             on_sample=lambda s: answered.append(s.id))
    assert answered == ["0"]
    assert resumed["failures"] == 1 and resumed["n"] == 3
    stored = {x["id"]: x for x in map(json.loads, (out / SAMPLES).read_text().splitlines())}
    assert len(stored) == 3 and len((out / SAMPLES).read_text().splitlines()) == 3
    expected = [json.loads(x) for x in (tmp_path / "full" / SAMPLES).read_text().splitlines()]
    assert _without_timing(stored["0"]) == _without_timing(expected[0])
    assert stored["2"]["error"].startswith("ContextLengthError")
    assert resumed["correct"] == full["correct"] - int(expected[2]["correct"])


@needs_data
async def test_a_question_the_engine_rejects_is_a_counted_failure(tmp_path: Path) -> None:
    """Real GSM8K few-shot prompts exceed the toy models' 512-token window: each is recorded as a
    failure (scored wrong) and the run goes on."""
    bench = get_benchmark("gsm8k")
    summary = await evaluate(engine(), bench, config(), tmp_path, limit=2, progress=False)
    assert summary["failures"] == 2 and summary["n"] == 2 and summary["accuracy"] == 0.0
    sample = json.loads((tmp_path / SAMPLES).read_text().splitlines()[0])
    assert sample["error"].startswith("ContextLengthError") and sample["finish_reason"] == "error"


def test_wilson_interval() -> None:
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(100, 100)[1] == 1.0 and wilson_interval(0, 0) == (0.0, 1.0)


def test_cli_offers_every_engine_method_and_both_eval_forms() -> None:
    parser = build_parser()
    method = next(a for a in parser._subparsers._group_actions[0].choices["eval"]._actions if a.dest == "method")
    assert tuple(method.choices) == METHODS            # a method added to options.METHODS shows up here
    args = parser.parse_args(["eval", "--bench", "flores", "--pair", "de-en", "--models", "a,b", "--limit", "3"])
    assert (args.bench, args.pair, args.models, args.limit, args.eval_command) == \
        ("flores", "de-en", ["a", "b"], 3, None)
    args = parser.parse_args(["eval", "compare", "x", "y", "--plots", "p"])
    assert (args.eval_command, args.dirs, args.plots) == ("compare", ["x", "y"], "p")


def test_compare_draws_its_plots_beside_the_runs_not_in_the_current_folder(tmp_path: Path) -> None:
    from shared_engine.evaluation.cli import default_plots_dir

    runs = tmp_path / "runs"
    assert default_plots_dir([runs / "gsm8k-safe", runs / "gsm8k-single"]) == runs.resolve() / "plots"
    assert default_plots_dir([runs / "a" / "x", runs / "b" / "y"]) == runs.resolve() / "plots"


async def test_compare_prints_a_table_and_draws_its_plots(tmp_path: Path) -> None:
    bench = toy_bench(tmp_path, questions=2)
    await evaluate(engine(), bench, config(), tmp_path / "safe", progress=False)
    single = EnsembleEngine([toy_member("a", "byte_level", "llama", 1)], method="single")
    await evaluate(single, bench, config("single"), tmp_path / "single", progress=False)
    text = compare_runs([tmp_path / "safe", tmp_path / "single"], tmp_path / "plots", baseline=tmp_path / "single")
    safe_rows = [json.loads(x)["correct"] for x in (tmp_path / "safe" / SAMPLES).read_text().splitlines()]
    single_rows = [json.loads(x)["correct"] for x in (tmp_path / "single" / SAMPLES).read_text().splitlines()]
    wins = sum(a and not b for a, b in zip(safe_rows, single_rows))
    losses = sum(b and not a for a, b in zip(safe_rows, single_rows))
    both = sum(a and b for a, b in zip(safe_rows, single_rows))
    assert f"| safe (a+b) | 2 | {both} | {wins} | {losses} |" in text
    assert "| both right | right only here | right only in baseline |" in text
    assert "chrF" not in text  # translation's words only on translation runs
    # the paired difference in accuracy points, with its interval
    assert f"| {100 * (wins - losses) / 2:+.2f} pts (" in text
    assert "| toy | safe (a+b) | 2 |" in text and "| toy | single (a+b) | 2 |" in text
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    # with a baseline, the paired differences are drawn too
    assert pngs == ["toy-accuracy.png", "toy-paired.png", "toy-tokens-per-s.png", "toy-vs-ensemble-rate.png"]
    assert all((tmp_path / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    assert "prompt versions" not in text
    summary_file = tmp_path / "single" / SUMMARY
    summary_file.write_text(json.dumps({**json.loads(summary_file.read_text()), "prompt_version": "eval-prompts-v2"}))
    mixed = compare_runs([tmp_path / "safe", tmp_path / "single"], tmp_path / "plots")
    assert "note: the runs used different prompt versions: " in mixed and "eval-prompts-v2: single (a+b)" in mixed
    with pytest.raises(InvalidRequestError, match="summary.json"):
        compare_runs([tmp_path / "nowhere"], tmp_path / "plots")
    (tmp_path / "safe.log").write_text("toy safe:  50%|#####     | 1/2\n")  # a log, as a shell glob picks it up
    with pytest.raises(InvalidRequestError, match="not an eval run's summary.json"):
        compare_runs([tmp_path / "safe", tmp_path / "safe.log"], tmp_path / "plots")
    # the same settings run twice (another commit): each row says which folder it is
    shutil.copytree(tmp_path / "safe", tmp_path / "safe-again")
    twice = compare_runs([tmp_path / "safe", tmp_path / "safe-again"], tmp_path / "plots", baseline=tmp_path / "safe")
    assert "| toy | safe (a+b) [safe] | 2 |" in twice and "| safe (a+b) [safe-again] | 2 | " in twice


async def test_compare_by_group_pairs_each_run_within_each_task(tmp_path: Path) -> None:
    bench = toy_bench(tmp_path, questions=4)
    grouped = Dataset(name="toy", source="memory", records=[
        Record(id=str(i), question=f"Q: What is {i} + {i}?", answers=[str(2 * i)], group="ab"[i // 2])
        for i in range(4)])
    bench = dataclasses.replace(bench, load=lambda _path: grouped)
    await evaluate(engine(), bench, config(), tmp_path / "safe", progress=False)
    single = EnsembleEngine([toy_member("a", "byte_level", "llama", 1)], method="single")
    await evaluate(single, bench, config("single"), tmp_path / "single", progress=False)
    # a known pattern: task a has one question won and one lost, task b one won and one both right
    for run, correct in (("single", [True, False, True, False]), ("safe", [False, True, True, True])):
        file = tmp_path / run / SAMPLES
        rows = [json.loads(x) for x in file.read_text().splitlines()]
        assert [r["group"] for r in rows] == ["a", "a", "b", "b"]
        file.write_text("".join(json.dumps({**r, "correct": c}) + "\n" for r, c in zip(rows, correct)))
    text = compare_runs([tmp_path / "safe", tmp_path / "single"], tmp_path / "plots", baseline=tmp_path / "single",
                        by_group=True)
    assert "| safe (a+b) | 4 | 1 | 2 | 1 |" in text  # overall: both right, won, lost
    assert "| +25.00 pts (" in text  # (2 - 1) / 4
    assert f"By group, safe (a+b) paired with {tmp_path / 'single'}:" in text
    assert "| a | 2 | 50% | 50% | 1 | 1 | 0.750 |" in text
    assert "| b | 2 | 50% | 100% | 1 | 0 | 1.000 |" in text
    with pytest.raises(InvalidRequestError, match="--baseline"):
        compare_runs([tmp_path / "safe"], tmp_path / "plots", by_group=True)


@needs_data
def test_translation_summary_is_corpus_chrf_and_bleu_not_accuracy() -> None:
    bench = get_benchmark("flores", data=None, pair="de-en")
    records = bench.dataset().records[:3]
    samples = []
    for i, record in enumerate(records):
        output = record.answers[0] if i < 2 else "Something else entirely."
        score = bench.score(output, record)
        samples.append(Sample(id=record.id, prompt=bench.messages(record), output=output, gold=record.answers,
                              extracted=score.extracted, correct=score.correct, value=score.value,
                              finish_reason="eos", stats={"tokens": 10, "elapsed_s": 1.0, "ensembled_tokens": 2}))
    summary = summarize(samples, RunConfig(bench=bench.name, models=["m"], method="single", max_new_tokens=8),
                        bench, {}, len(records))
    assert summary["accuracy"] is None and summary["ci95"] is None and summary["metric"] == "chrf"
    assert 50 < summary["chrf"] < 100 and summary["score"] == summary["chrf"] and 0 < summary["bleu"] < 100
    assert summary["ensemble_rate"] == round(6 / 33, 4)   # the EOS that ended each answer was a decided position
    assert summary["tokens_per_s"] == 10.0


async def test_resume_rescores_stored_answers_with_the_current_scorer(tmp_path: Path) -> None:
    bench = toy_bench(tmp_path, questions=2)
    first = await evaluate(engine(), bench, config(), tmp_path, progress=False)
    lenient = dataclasses.replace(
        bench, score=lambda out, r, finish=None: score_number("The answer is " + r.answers[0], r.answers[0]))
    answered = []
    again = await evaluate(engine(), lenient, config(), tmp_path, resume=True, progress=False,
                           on_sample=lambda s: answered.append(s.id))
    assert answered == [] and again["correct"] == 2 and first["n"] == again["n"] == 2
    assert all(json.loads(line)["correct"] for line in (tmp_path / SAMPLES).read_text().splitlines())


def test_sign_test_matches_hand_computed_binomial_tails() -> None:
    from shared_engine.evaluation.compare import sign_test

    assert sign_test(0, 7) == pytest.approx((2 / 128, 1 / 128))  # the issue's +0 -7: p = 0.016
    assert sign_test(3, 11)[0] == pytest.approx(2 * (1 + 14 + 91 + 364) / 2**14)  # README's +3 -11
    assert sign_test(11, 3)[1] == pytest.approx(1 - (1 + 14 + 91) / 2**14)  # many wins: "worse" unlikely
    assert sign_test(0, 0) == (1.0, 1.0) and sign_test(5, 5)[0] == 1.0


def test_accuracy_difference_is_wins_minus_losses_with_newcombes_paired_interval() -> None:
    """The paired accuracy difference with Newcombe's interval for paired proportions: close to the
    normal one at large N, well-behaved with few discordant questions (where a bootstrap of 0 / 2 can
    never resample a win), mirrored when the two runs swap, and on the sign test's side of 0 where
    that test is clear."""
    from shared_engine.evaluation.compare import accuracy_difference

    delta, ci = accuracy_difference(31, 16, 113, 1000)  # the README's TriviaQA trio
    half = 1.96 * math.sqrt((47 / 1000 - 0.015**2) / 1000)
    assert delta == 0.015 and ci == pytest.approx((0.015 - half, 0.015 + half), abs=0.002)
    delta, ci = accuracy_difference(0, 2, 49, 100)  # 0 / 2, sign test p = 0.5: on both sides of 0, not at -2
    assert delta == -0.02 and ci is not None and ci[0] < -0.03 and ci[1] > 0.01
    # swapping the runs mirrors the interval (both right and both wrong stay; wins and losses swap)
    low, high = accuracy_difference(6, 4, 5, 100)[1] or (0, 0)
    assert accuracy_difference(4, 6, 5, 100) == (-0.02, (pytest.approx(-high), pytest.approx(-low)))
    for wins, losses, both, n, excludes_zero in ((0, 7, 2, 60, True), (5, 19, 0, 100, True), (2, 8, 1, 100, False),
                                                  (4, 3, 6, 100, False), (10, 14, 27, 200, False)):
        low, high = accuracy_difference(wins, losses, both, n)[1] or (0, 0)
        assert low < (wins - losses) / n < high and (low > 0 or high < 0) == excludes_zero, (wins, losses)
    assert accuracy_difference(0, 0, 40, 100)[0] == 0.0 and accuracy_difference(0, 0, 0, 0) == (0.0, None)
    with pytest.raises(InvalidRequestError, match="do not fit"):
        accuracy_difference(60, 30, 20, 100)


def test_chrf_runs_pair_by_sentence_chrf_with_a_bootstrap_interval_of_the_corpus_difference(tmp_path: Path) -> None:
    """Translation runs have no right/wrong: the paired view compares each sentence's chrF, and the
    corpus chrF difference must equal sacrebleu's own corpus scores, its interval bracketing it."""
    import sacrebleu

    from shared_engine.evaluation.compare import chrf_difference, paired

    refs = ["Der Hund schläft im Garten.", "Ich trinke gern Kaffee am Morgen.", "Das Haus ist sehr alt.",
            "Wir fahren morgen nach Berlin.", "Sie liest ein spannendes Buch."]
    good = ["Der Hund schläft im Garten.", "Ich trinke Kaffee am Morgen.", "Das Haus ist alt.",
            "Wir fahren nach Berlin.", "Sie liest ein Buch."]
    bad = ["Der Katze schläft.", "Ich trinke gern Kaffee am Morgen.", "Haus.", "Morgen Berlin.", "Buch lesen."]
    refs, good, bad = refs * 4, good * 4, bad * 4  # 20 sentences: enough for the interval to exclude 0
    for name, outputs in (("good", good), ("bad", bad)):
        (tmp_path / name).mkdir()
        (tmp_path / name / SUMMARY).write_text(json.dumps({"metric": "chrf"}))
        rows = [{"id": str(i), "gold": [r], "extracted": o,
                 "value": sacrebleu.sentence_chrf(o, [r]).score / 100, "correct": False}
                for i, (o, r) in enumerate(zip(outputs, refs))]
        (tmp_path / name / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = paired(tmp_path / "good", tmp_path / "bad")
    expected = sacrebleu.corpus_chrf(bad, [refs]).score - sacrebleu.corpus_chrf(good, [refs]).score
    assert result["chrf_delta"] == pytest.approx(expected, abs=0.01) and expected < -10
    low, high = result["chrf_delta_ci95"]
    assert low <= result["chrf_delta"] <= high < 0
    assert (result["wins"], result["losses"], result["both_right"]) == (4, 16, 0)  # "bad" has sentence 2 exact
    rows = [json.loads(line) for line in (tmp_path / "good" / SAMPLES).read_text().splitlines()]
    assert chrf_difference(rows, rows) == (0.0, (0.0, 0.0))
    from shared_engine.evaluation.compare import paired_table

    table = paired_table(tmp_path / "good", [({"label": "bad"}, result)])
    assert "| sentences tied | chrF higher here | chrF higher in baseline |" in table
    assert "| bad | 20 | 0 | 4 | 16 |" in table
    # a baseline still running has no summary yet, only its config: still paired by chrF
    (tmp_path / "good" / SUMMARY).unlink()
    (tmp_path / "good" / "config.json").write_text(json.dumps({"bench": "flores-en-de"}))
    assert paired(tmp_path / "good", tmp_path / "bad") == result


def test_run_labels_give_zoo_members_their_short_name_on_any_backend() -> None:
    from shared_engine.evaluation.compare import run_label

    summary = {"method": "safe", "models": ["llamacpp:qwen2.5-coder-0.5b-instruct", "gemma-3-270m"],
               "engine_options": {"drafter_confidence": 0.5, "weights": [2, 1]}}
    assert run_label(summary) == "safe (qwen+gemma) dc=0.5 w=2,1"
    # SAFE's default drafter weight (None: 2/3 for the drafter) is not shown; the papers' equal weights are
    safe = {"method": "safe", "models": ["qwen2.5-coder-0.5b-instruct", "gemma-3-270m"]}
    assert run_label({**safe, "engine_options": {"drafter_weight": None}}) == "safe (qwen+gemma)"
    assert run_label({**safe, "engine_options": {"drafter_weight": 1.0}}) == "safe (qwen+gemma) dw=1"
    assert run_label({**safe, "method": "every-token", "engine_options": {"drafter_weight": 1.0}}) == \
        "every-token (qwen+gemma)"
    assert run_label({"method": "single", "models": ["llamacpp:http://h:8080"], "engine_options": {}}) == \
        "single (h:8080)"


def test_long_run_labels_go_on_short_lines_under_their_bars() -> None:
    from shared_engine.evaluation.compare import BAR_LABEL_WIDTH, _bar_label

    label = "safe (qwen+gemma) drafter=auto dc=0.5"
    lines = _bar_label(label).split("\n")
    assert len(lines) > 1 and all(len(line) <= BAR_LABEL_WIDTH for line in lines)
    assert " ".join(lines) == label and _bar_label("single (qwen)") == "single (qwen)"


def _run_folder(folder: Path, bench: str, rows: list[dict], method: str = "safe", raw_tail: bytes = b"") -> Path:
    """A finished run as eval writes it: summary.json and samples.jsonl (plus an optional cut-off tail)."""
    folder.mkdir(parents=True)
    (folder / SUMMARY).write_text(json.dumps({
        "bench": bench, "method": method, "models": ["m"], "engine_options": {}, "n": len(rows),
        "metric": "chrf" if bench.startswith("flores") else "accuracy", "score": 0.5, "accuracy": 0.5,
        "ci95": [0.1, 0.9], "ensemble_rate": 0.0, "tokens_per_s": 1.0, "forward_passes_per_token": {},
        "mean_output_tokens": 3, "truncated": 0, "failures": 0, "max_new_tokens": 8}))
    (folder / SAMPLES).write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + raw_tail)
    return folder


def test_compare_pairs_only_the_baselines_benchmark_by_question_and_reads_what_a_cut_run_holds(tmp_path: Path) -> None:
    from shared_engine.evaluation.compare import compare_runs, paired

    right = [{"id": str(i), "correct": True, "value": 1.0} for i in range(4)]
    wrong = [{"id": str(i), "correct": i == 3, "value": float(i == 3)} for i in range(4)]
    # the baseline asked question 0 again on resume (so it stands last) and was cut off mid-line,
    # inside a multi-byte character
    base = _run_folder(tmp_path / "base", "gsm8k", [*wrong[1:], wrong[0]], method="single",
                       raw_tail='{"id": "9", "extracted": "Mäu'.encode()[:-1])
    run = _run_folder(tmp_path / "run", "gsm8k", right)
    other_bench = _run_folder(tmp_path / "nq", "nq", right)  # ids "0".."3" too, other questions
    assert paired(base, run)["n"] == 4 and (paired(base, run)["wins"], paired(base, run)["losses"]) == (3, 0)
    text = compare_runs([base, run, other_bench], tmp_path / "plots", baseline=base / SUMMARY)
    rows = [line for line in text.splitlines() if line.startswith("| safe (m)") and "pts (" in line]
    assert len(rows) == 1 and rows[0].startswith("| safe (m) [run] | 4 | 1 | 3 | 0 |"), text  # not the NQ run
    assert "not paired (another benchmark than the baseline's): safe (m) [nq]" in text
    assert "| single (m) |" not in text.split("Paired with")[1].split("not paired")[0]  # nor itself
    # a relative baseline path against absolute run folders is still the baseline
    relative = Path(shutil.os.path.relpath(base, Path.cwd()))
    paired_part = compare_runs([base, run], tmp_path / "plots", baseline=relative).split("Paired with")[1]
    assert "| single (m) |" not in paired_part and "| safe (m) | 4 | 1 | 3 | 0 |" in paired_part


def test_a_translation_run_grouped_shows_chrf_in_points(tmp_path: Path) -> None:
    from shared_engine.evaluation.compare import group_tables, load_summaries

    rows = [{"id": str(i), "group": "g", "value": v, "gold": ["x"], "extracted": "x"} for i, v in enumerate([0.5, 0.6])]
    base = _run_folder(tmp_path / "base", "flores-en-de", rows, method="single")
    run = _run_folder(tmp_path / "run", "flores-en-de", [{**r, "value": r["value"] + 0.1} for r in rows])
    table = group_tables(base, load_summaries([base, run]))
    assert "| g | 2 | 55.0 | 65.0 | 2 | 0 |" in table, table


def test_a_samples_file_cut_inside_a_character_keeps_its_complete_lines(tmp_path: Path) -> None:
    from shared_engine.evaluation.runner import read_samples

    file = tmp_path / SAMPLES
    whole = Sample(id="0", prompt=[], output="Mäuse", gold=["Mäuse"], extracted="Mäuse", correct=False, value=1.0,
                   finish_reason="eos")
    file.write_bytes(whole.model_dump_json().encode() + b"\n" + whole.model_dump_json().encode()[:-12])
    assert [s.id for s in read_samples(file)] == ["0"]
    assert file.read_bytes() == whole.model_dump_json().encode() + b"\n"  # the cut tail is removed


async def test_a_limit_below_one_question_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="at least 1"):
        await evaluate(engine(), toy_bench(tmp_path), config(), tmp_path / "out", limit=-5, progress=False)


def test_a_run_on_another_backend_than_a_names_default_is_another_run(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    # --backend transformers for zoo names used to record the same config and --out as the default
    # (llama.cpp) run, so --resume mixed the two backends' answers.
    monkeypatch.chdir(tmp_path)  # the default --out is under the working directory, not the clone's
    import shared_engine.evaluation.cli as eval_cli
    from shared_engine.data_paths import GSM8K_SAMPLE

    seen: list[tuple[RunConfig, Path]] = []

    async def record(engine, bench, config, out, **options):  # noqa: ANN001, ANN003, ANN202
        seen.append((config, out))
        return {"score": 0.5, "ci95": [0, 1], "n": 0, "ensemble_rate": 0, "tokens_per_s": 0, "truncated": 0,
                "failures": 0, "skipped": {}}

    monkeypatch.setattr(eval_cli, "evaluate", record)
    zoo = "qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct"
    for backend in ([], ["--backend", "llamacpp"], ["--backend", "transformers"]):
        eval_cli.run(build_parser().parse_args(["eval", "--bench", "gsm8k", "--models", zoo, *backend,
                                                "--data", str(GSM8K_SAMPLE), "--no-progress"]))
    (default, _), (named_default, _), (other, other_out) = seen
    assert default == named_default  # naming the default backend changes nothing
    assert other != default and other.models == [f"transformers:{m}" for m in zoo.split(",")]
    assert other_out.name == "gsm8k-safe-qwen2.5@transformers+smollm2@transformers"


async def test_the_members_load_with_a_notice_before_the_first_question(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The seconds to minutes the members take to load (llama.cpp servers, the zoo's install) are
    announced before the progress bar, not spent at 0/N; a resumed run with nothing left loads nothing."""
    bench = toy_bench(tmp_path, questions=1)
    await evaluate(engine(), bench, config(), tmp_path / "run")
    err = capsys.readouterr().err
    assert "loading 2 members (a, b) ..." in err and err.index("loaded in ") < err.index("1/1")
    finished = engine()
    await evaluate(finished, bench, config(), tmp_path / "run", resume=True)
    assert not finished.loaded and "loading" not in capsys.readouterr().err


async def test_a_member_that_cannot_load_fails_the_run_not_each_question(tmp_path: Path) -> None:
    """With progress off, a mistyped member failed every question and the run ended 'accuracy 0'."""
    broken = EnsembleEngine([toy_member("a", "byte_level", "llama", 1), "no-such-model-anywhere"], method="safe")
    with pytest.raises(InvalidRequestError, match="unknown model"):
        await evaluate(broken, toy_bench(tmp_path), config(), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / SUMMARY).exists()


async def test_compare_skips_its_own_plots_folder_when_a_glob_picks_it_up(tmp_path: Path) -> None:
    """``eval compare runs/*`` writes ``runs/plots/``; the next ``runs/*`` glob must not fail on it."""
    runs = tmp_path / "runs"
    await evaluate(engine(), toy_bench(tmp_path, questions=2), config(), runs / "safe", progress=False)
    compare_runs([runs / "safe"], runs / "plots")
    text = compare_runs(sorted(runs.iterdir()), runs / "plots")
    assert "| toy | safe (a+b) | 2 |" in text
    assert f"note: skipped {runs / 'plots'} (no summary.json or config.json: not an eval run)" in text
    with pytest.raises(InvalidRequestError, match="no summary.json in"):
        compare_runs([runs / "plots"], runs / "plots")


def test_a_profile_run_has_its_own_default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default --out ignored --profile: a plain run and a --profile run collided (--resume refused)."""
    from shared_engine.evaluation import cli

    monkeypatch.chdir(tmp_path)  # the default --out is under the working directory, not the clone's
    from shared_engine.profile import EnsembleProfile, FitInfo

    profile = tmp_path / "tuned.json"
    EnsembleProfile(members=["a", "b"], weights=[0.1, 0.9], drafter="b", drafter_confidence=0.9,
                    fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=1, method="t")).save(str(profile))
    folders: list[Path] = []

    async def record(engine: Any, bench: Any, config: Any, out: Path, **kwargs: Any) -> dict[str, Any]:
        folders.append(out)
        raise KeyboardInterrupt  # nothing runs: the folder is all this checks

    monkeypatch.setattr(cli, "evaluate", record)
    parser = build_parser()
    for extra in ([], ["--profile", str(profile)]):
        args = parser.parse_args(["eval", "--bench", "gsm8k", "--models", "a,b", "--method", "safe",
                                  "--data", str(_gsm8k_file(tmp_path)), *extra])
        with pytest.raises(KeyboardInterrupt):
            cli.run(args)
    assert folders == [Path("eval-runs/gsm8k-safe-a+b"), Path("eval-runs/gsm8k-safe-a+b-tuned")]


async def test_resume_with_another_data_file_is_refused(tmp_path: Path) -> None:
    """``--resume --data other.jsonl`` was accepted and scored the old answers against the other file's gold."""
    bench = toy_bench(tmp_path, questions=2)
    await evaluate(engine(), bench, config(), tmp_path / "run", progress=False)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert recorded["data"] == str(bench.path.resolve()) and recorded["data_sha256"]
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"question": "2 + 2?", "answer": "#### 4"}) + "\n")
    with pytest.raises(InvalidRequestError, match="different settings.*data"):
        await evaluate(engine(), dataclasses.replace(bench, path=other), config(), tmp_path / "run", resume=True,
                       progress=False)
    # the same content at another path (a moved data folder) resumes
    moved = tmp_path / "moved.jsonl"
    shutil.copy(bench.path, moved)
    await evaluate(engine(), dataclasses.replace(bench, path=moved), config(), tmp_path / "run", resume=True,
                   progress=False)
    # a run written before the data file was recorded resumes (what it read is unknown)
    (tmp_path / "run" / "config.json").write_text(json.dumps({k: v for k, v in recorded.items()
                                                              if not k.startswith("data")}))
    summary = await evaluate(engine(), dataclasses.replace(bench, path=other), config(), tmp_path / "run",
                             resume=True, progress=False)
    assert summary["n"] == 2


def test_compare_does_not_pair_runs_of_another_data_file(tmp_path: Path) -> None:
    """``--baseline`` paired a run of another data file by id alone, as "the same questions"."""
    def rows(question: str, correct: bool) -> list[dict]:
        return [{"id": str(i), "correct": correct, "value": float(correct), "gold": [str(i)],
                 "output": f"The answer is {i if correct else 'x'}.",
                 "prompt": [{"role": "user", "content": f"{question} {i}"}]} for i in range(3)]

    base = _run_folder(tmp_path / "base", "gsm8k", rows("Q", False), method="single")
    same = _run_folder(tmp_path / "same", "gsm8k", rows("Q", True))
    other = _run_folder(tmp_path / "other", "gsm8k", rows("Q", True), method="every-token")
    asked_other = _run_folder(tmp_path / "asked", "gsm8k", rows("Other question", True), method="cooperative")
    for folder, sha in ((base, "aa"), (same, "aa"), (other, "bb")):  # asked_other: written before the hash
        summary = json.loads((folder / SUMMARY).read_text())
        (folder / SUMMARY).write_text(json.dumps({**summary, "data_sha256": sha}))
    text = compare_runs([base, same, other, asked_other], tmp_path / "plots", baseline=base)
    paired_part = text.split("Paired with")[1]
    assert "| safe (m) | 3 | 0 | 3 | 0 |" in paired_part
    assert "| every-token (m) |" not in paired_part.split("not paired")[0]
    assert "not paired (another data file than the baseline's): every-token (m)" in text
    assert "not paired (other questions under the same ids than the baseline's): cooperative (m)" in text


def test_a_question_that_failed_for_a_passing_reason_is_no_wrong_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A member's timeout counted as a wrong answer in the summary and as a paired loss in compare."""
    import asyncio

    bench = toy_bench(tmp_path, questions=3)
    for name in ("base", "run"):
        asyncio.run(evaluate(engine(), bench, config(), tmp_path / name, progress=False))
    file = tmp_path / "run" / SAMPLES
    lines = [json.loads(x) for x in file.read_text().splitlines()]
    lines[0].update(output="", extracted=None, correct=False, value=0.0, finish_reason="error", stats=None,
                    error="MemberError: member 'a' at http://x: POST /completion failed after 3 attempt(s)")
    lines[1].update(output="", extracted=None, correct=False, value=0.0, finish_reason="error", stats=None,
                    error="ContextLengthError: the prompt has 600 tokens; member 'a' holds 512")
    file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    samples = [Sample.model_validate(x) for x in lines]
    summary = summarize(samples, config(), bench, {}, 3)
    assert summary["n"] == 2 and summary["transient_failures"] == 1 and summary["failures"] == 1
    assert summary["correct"] == int(lines[2]["correct"])  # the rejected question counts as wrong, as before
    (tmp_path / "run" / SUMMARY).write_text(json.dumps(summary))
    text = compare_runs([tmp_path / "base", tmp_path / "run"], tmp_path / "plots", baseline=tmp_path / "base")
    assert "| safe (a+b) [run] | 2 |" in text.split("Paired with")[1]  # the timed-out question is not a loss
    assert "left out of N and the pairing (rerun with --resume): safe (a+b) [run]: 1" in text
    # the CLI's end line says what to do
    import shared_engine.evaluation.cli as eval_cli

    async def finished(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return summary

    monkeypatch.setattr(eval_cli, "evaluate", finished)
    eval_cli.run(build_parser().parse_args(["eval", "--bench", "gsm8k", "--models", "a", "--no-progress",
                                            "--data", str(_gsm8k_file(tmp_path)), "--out", str(tmp_path / "x")]))
    assert "1 question(s) failed for a passing reason: rerun with --resume" in capsys.readouterr().out


async def test_compare_pairs_only_the_questions_a_run_resumed_with_a_smaller_limit_counts(tmp_path: Path) -> None:
    """Resumed with a smaller --limit, the summary counted the first N questions while compare's
    paired table (and a re-scored summary) used every stored answer."""
    bench = toy_bench(tmp_path, questions=3)
    await evaluate(engine(), bench, config(), tmp_path / "base", progress=False)
    await evaluate(engine(), bench, config(), tmp_path / "run", progress=False)
    summary = await evaluate(engine(), bench, config(), tmp_path / "run", limit=2, resume=True, progress=False)
    assert summary["n"] == 2 and summary["ids"] == ["0", "1"]
    assert "ids" not in json.loads((tmp_path / "base" / SUMMARY).read_text())  # only where the file holds more
    text = compare_runs([tmp_path / "base", tmp_path / "run"], tmp_path / "plots", baseline=tmp_path / "base")
    assert "| safe (a+b) [run] | 2 |" in text.split("Paired with")[1], text


async def test_a_start_that_failed_before_any_answer_neither_blocks_resume_nor_compare(tmp_path: Path) -> None:
    """A misspelt model left config.json: every later --resume into the folder was refused, and
    ``eval compare runs/*`` failed on it."""
    broken = EnsembleEngine([toy_member("a", "byte_level", "llama", 1), "no-such-model-anywhere"], method="safe")
    misspelt = config().model_copy(update={"models": ["a", "no-such-model-anywhere"]})
    with pytest.raises(InvalidRequestError, match="unknown model"):
        await evaluate(broken, toy_bench(tmp_path), misspelt, tmp_path / "runs" / "failed", progress=False)
    with pytest.raises(InvalidRequestError, match="unknown model"):
        await evaluate(broken, toy_bench(tmp_path), misspelt, tmp_path / "runs" / "run", progress=False)
    summary = await evaluate(engine(), toy_bench(tmp_path), config(), tmp_path / "runs" / "run", resume=True,
                             progress=False)
    assert summary["n"] == 3 and json.loads((tmp_path / "runs" / "run" / "config.json").read_text())["models"] == \
        ["a", "b"]
    text = compare_runs(sorted((tmp_path / "runs").iterdir()), tmp_path / "plots")
    assert "| toy | safe (a+b) | 3 |" in text
    assert f"note: skipped {tmp_path / 'runs' / 'failed'} (a run that answered no question" in text


def test_compare_skips_a_json_line_that_is_not_an_answer(tmp_path: Path) -> None:
    """A JSON line in samples.jsonl that is not a sample ({"note": "x"}) crashed compare with a KeyError."""
    rows = [{"id": str(i), "correct": i < 2, "value": float(i < 2)} for i in range(3)]
    base = _run_folder(tmp_path / "base", "gsm8k", rows, method="single")
    run = _run_folder(tmp_path / "run", "gsm8k", rows, raw_tail=b'{"note": "x"}\n[1, 2]\n{"id": 7, "correct": true}\n')
    text = compare_runs([base, run], tmp_path / "plots", baseline=base)
    assert "| safe (m) | 3 | 2 | 0 | 0 |" in text
    assert "note: skipped lines of samples.jsonl that are not answers (no id and verdict): safe (m): 2" in text


def test_compare_pairs_no_run_without_its_samples(tmp_path: Path) -> None:
    """A run folder with summary.json but no samples.jsonl crashed --baseline with FileNotFoundError."""
    rows = [{"id": str(i), "correct": True, "value": 1.0} for i in range(3)]
    base = _run_folder(tmp_path / "base", "gsm8k", rows, method="single")
    run = _run_folder(tmp_path / "run", "gsm8k", rows)
    (run / SAMPLES).unlink()
    text = compare_runs([base, run], tmp_path / "plots", baseline=base)
    assert "not paired (no samples.jsonl to pair by question): safe (m)" in text
    with pytest.raises(InvalidRequestError, match="--baseline .* has no samples.jsonl"):
        compare_runs([base, run], tmp_path / "plots", baseline=run)


async def test_bad_output_paths_are_one_line_errors_before_any_work(tmp_path: Path) -> None:
    """``compare --json newdir/rows.json`` failed with a traceback after the plots were written; ``--plots``
    naming a file and ``eval --out`` naming a file (a log) were tracebacks too."""
    await evaluate(engine(), toy_bench(tmp_path, questions=1), config(), tmp_path / "run", progress=False)
    with pytest.raises(InvalidRequestError, match="--json .*the folder .* does not exist"):
        compare_runs([tmp_path / "run"], tmp_path / "plots", json_out=str(tmp_path / "new" / "rows.json"))
    assert not (tmp_path / "plots").exists()  # nothing drawn before the error
    (tmp_path / "a.log").write_text("log\n")
    with pytest.raises(InvalidRequestError, match="--plots .* is a file"):
        compare_runs([tmp_path / "run"], tmp_path / "a.log")
    with pytest.raises(InvalidRequestError, match="--out .* is a file"):
        await evaluate(engine(), toy_bench(tmp_path, questions=1), config(), tmp_path / "a.log", progress=False)
    with pytest.raises(InvalidRequestError, match="--out .*cannot make the run's folder"):
        await evaluate(engine(), toy_bench(tmp_path, questions=1), config(), tmp_path / "a.log" / "run",
                       progress=False)


def test_max_new_tokens_zero_is_refused_not_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``eval --max-new-tokens 0`` silently ran with the benchmark's default (512 for GSM8K)."""
    import shared_engine.evaluation.cli as eval_cli

    async def never(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("evaluated with max_new_tokens 0")

    monkeypatch.setattr(eval_cli, "evaluate", never)
    args = build_parser().parse_args(["eval", "--bench", "gsm8k", "--models", "a", "--max-new-tokens", "0",
                                      "--data", str(_gsm8k_file(tmp_path)), "--out", str(tmp_path / "run")])
    with pytest.raises(InvalidRequestError, match="max_new_tokens"):
        eval_cli.run(args)


def test_ctrl_c_says_the_answers_are_saved_and_resume_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """After Ctrl-C the eval CLI exited 130 without a word."""
    import shared_engine.evaluation.cli as eval_cli

    async def interrupted(engine: Any, bench: Any, config: Any, out: Path, **kwargs: Any) -> dict[str, Any]:
        out.mkdir()
        (out / SAMPLES).write_text('{"id": "0"}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_cli, "evaluate", interrupted)
    args = build_parser().parse_args(["eval", "--bench", "gsm8k", "--models", "a", "--no-progress",
                                      "--data", str(_gsm8k_file(tmp_path)), "--out", str(tmp_path / "run")])
    with pytest.raises(KeyboardInterrupt):
        eval_cli.run(args)
    err = capsys.readouterr().err
    assert f"the answers so far are saved in {tmp_path / 'run' / SAMPLES}" in err and "with --resume continues" in err


async def test_the_progress_bar_shows_chrf_on_the_scale_of_the_final_line(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """FLORES' bar showed chrF=0.412 (sentence chrF / 100) while the run's last line said chrf=41.2."""
    from shared_engine.evaluation.scoring import Score

    bench = dataclasses.replace(toy_bench(tmp_path, questions=2), metric="chrf",
                                score=lambda out, r, finish=None: Score(extracted=out, correct=False, value=0.5))
    await evaluate(engine(), bench, config(max_new_tokens=2), tmp_path / "run")
    err = capsys.readouterr().err
    assert "chrF=50.0" in err and "chrF=0.5" not in err, err


def test_runs_in_folders_of_the_same_name_get_labels_and_bars_of_their_own(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """old/eval-runs/X and new/eval-runs/X (the default --out in two checkouts) were both labelled
    "safe (m) [X]", and each plot drew their two bars at one x position: one run disappeared."""
    from shared_engine.evaluation import compare

    rows = [{"id": str(i), "correct": i < 2, "value": float(i < 2)} for i in range(3)]
    old = _run_folder(tmp_path / "old" / "eval-runs" / "X", "gsm8k", rows)
    new = _run_folder(tmp_path / "new" / "eval-runs" / "X", "gsm8k", rows)
    other = _run_folder(tmp_path / "Y", "gsm8k", rows)
    bars: dict[str, list[float]] = {}

    def record(fig: Any, path: Path) -> Path:
        bars[path.name] = [patch.get_x() for patch in fig.axes[0].patches]
        return path

    monkeypatch.setattr(compare, "_save", record)
    text = compare.compare_runs([old, new, other], tmp_path / "plots")
    for tag in ("old/eval-runs/X", "new/eval-runs/X", "Y"):
        assert f"| gsm8k | safe (m) [{tag}] | 3 |" in text, text
    for name in ("gsm8k-accuracy.png", "gsm8k-tokens-per-s.png"):
        assert len(set(bars[name])) == 3, bars


@pytest.mark.parametrize("argv", [["--limit", "0"], ["--data", "no/such/file.jsonl"], ["--out", "notes.txt"]])
def test_a_start_that_fails_on_its_arguments_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              argv: list[str]) -> None:
    """``--limit 0`` or a missing --data left an empty eval-runs/... folder (the engine's fit cache made it
    before the run's checks), and ``--out notes.txt`` (a file) failed on the fit cache instead of saying so."""
    from shared_engine.evaluation import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("notes\n")
    data = ["--data", str(_gsm8k_file(tmp_path))] if "--data" not in argv else []
    args = build_parser().parse_args(["eval", "--bench", "gsm8k", "--models", "a,b", "--no-progress", *data, *argv])
    with pytest.raises(InvalidRequestError, match="at least 1|no/such/file|--out notes.txt is a file"):
        cli.run(args)
    assert not (tmp_path / "eval-runs").exists() and (tmp_path / "notes.txt").read_text() == "notes\n"
