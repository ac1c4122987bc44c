"""``safe-ensemble eval compare DIR...``: one table row per run, and three PNG plots per benchmark
(score per run with its 95% interval; score vs ensemble rate; tokens/s per run). With ``--baseline``
also a paired count per run: questions it gets right that the baseline misses, and the reverse —
on small N the paired view says more than two overlapping intervals — with the score difference's
95% interval (accuracy: Newcombe's for paired proportions; chrF: paired bootstrap), and a plot
of those differences (``paired_difference_plot``, which ``scripts/standing_plot.py`` also draws the
README's standing with). Every stored answer is scored again with the current scorer first
(``rescored``), so runs scored before and after a scoring fix compare by the same rules."""

from __future__ import annotations

import json
import math
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from ..engine_args import check_output_file
from ..errors import EnsembleError, InvalidRequestError
from ..members.spec import BACKENDS
from ..options import METHOD_DEFAULTS
from .benchmarks import is_translation, stored_scorer
from .runner import CONFIG, SAMPLES, SUMMARY, is_transient_error, lock_holder, sample_rows, wilson_interval
from .scoring import corpus_translation

BAR_LABEL_WIDTH = 22
"""Characters per line of a run label under its bar."""
_SHORT = {"qwen2.5-coder-0.5b-instruct": "qwen", "smollm2-135m-instruct": "smol", "gemma-3-270m": "gemma"}


def run_label(summary: dict[str, Any]) -> str:
    """``method (members)`` plus the options that tell runs apart; a member is shown by its display
    name (``MemberConfig.name``) when it has one, else by a short form of its model."""
    named = summary.get("member_options", {})
    models = "+".join(named.get(m, {}).get("name") or _short_name(m) for m in summary["models"])
    options = summary.get("engine_options", {})
    confidence, weights = options.get("drafter_confidence"), options.get("weights")
    drafter_weight, drafter = options.get("drafter_weight"), options.get("drafter")
    shown_drafter = ("auto" if drafter == "auto" else _drafter_label(summary, drafter)) if drafter is not None else None
    return (f"{summary['method']} ({models})"
            + (f" drafter={shown_drafter}" if shown_drafter and summary["method"] != "single" else "")
            + (f" dc={confidence}" if confidence else "")
            + (f" w={_weights_label(weights)}" if weights and summary["method"] != "single" else "")
            + (f" dw={drafter_weight:g}" if not weights and drafter_weight is not None
               and drafter_weight != METHOD_DEFAULTS.get(summary["method"], {}).get("drafter_weight", 1.0)
               and summary["method"] != "single" else "")
            + (f" plaus={options['plausibility']:g}" if options.get("plausibility") else "")
            + (f" guard={options['loop_guard']}" if options.get("loop_guard") else ""))


def _drafter_label(summary: dict[str, Any], drafter: str | int) -> str:
    """A configured drafter as the label shows members (an index or spec becomes its short name)."""
    models = summary["models"]
    if isinstance(drafter, int) or drafter.isdigit():
        return _short_name(models[int(drafter)]) if int(drafter) < len(models) else str(drafter)
    return _short_name(drafter)


def _short_name(model: str) -> str:
    """``qwen`` for ``qwen2.5-coder-0.5b-instruct`` and ``llamacpp:qwen2.5-coder-0.5b-instruct`` alike."""
    backend, _, target = model.partition(":")
    name = target if backend in BACKENDS and target and not target.startswith("http") else model
    return _SHORT.get(name, Path(name).name)


def _weights_label(weights: list[float] | str) -> str:
    return weights if isinstance(weights, str) else ",".join(f"{w:g}" for w in weights)  # "auto" or numbers


def _why_no_summary(folder: Path) -> str:
    """Why a run's folder has no summary: its run is still going (its eval holds the lock), or it stopped
    before writing one (answers, no summary: ``--resume`` writes it); empty where neither tells."""
    answered = (folder / SAMPLES).is_file() and (folder / SAMPLES).stat().st_size
    running = lock_holder(folder) if folder.is_dir() else None
    return (f"its run is still going, pid {running}: compare it when it ends" if running else
            "its run stopped before writing one: the same eval command with --resume writes it" if answered else "")


def load_summaries(dirs: list[Path]) -> list[dict[str, Any]]:
    summaries = []
    for folder in dirs:
        file = folder / SUMMARY if folder.is_dir() else folder
        if not file.is_file():
            why = _why_no_summary(folder)
            raise InvalidRequestError(f"no {SUMMARY} in {folder}" + (f" ({why})" if why else ""))
        try:
            summary = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            summary = None
        if not isinstance(summary, dict) or "bench" not in summary:  # e.g. a run's log beside its folder
            raise InvalidRequestError(f"{file} is not an eval run's {SUMMARY}: give the run's folder")
        summary["label"] = run_label(summary)
        summary["dir"] = str(file.parent)  # the run's folder, whether the folder or its summary was given
        summaries.append(summary)
    labels = Counter(s["label"] for s in summaries)
    for label in [label for label, count in labels.items() if count > 1]:
        # the same settings run twice (another commit, another day): say which folder
        same = [s for s in summaries if s["label"] == label]
        for summary, tag in zip(same, _folder_tags([Path(s["dir"]) for s in same])):
            summary["label"] += f" [{tag}]"
    return summaries


def _folder_tags(folders: list[Path]) -> list[str]:
    """The shortest end of each folder's path that tells it from the others: its name, else as many
    parents before it as it takes (old/eval-runs/X and new/eval-runs/X, the default --out in two checkouts)."""
    parts = [folder.resolve().parts for folder in folders]

    def tag(i: int) -> str:
        mine = parts[i]
        for depth in range(1, len(mine)):
            if all(other[-depth:] != mine[-depth:] for j, other in enumerate(parts) if j != i):
                return str(Path(*mine[-depth:]))
        return str(Path(*mine))  # the same folder given twice

    return [tag(i) for i in range(len(parts))]


def table(summaries: list[dict[str, Any]]) -> str:
    """A Markdown table (README-ready)."""
    header = ("| benchmark | run | N | score | 95% CI | ensemble rate | tokens/s | mean output tokens | "
              "s/question | forward passes per token | truncated | failures | max_new_tokens |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for s in summaries:
        score = s["score"]
        shown = "-" if score is None else (f"{score:.1f} chrF" if s["metric"] == "chrf" else f"{score:.1%}")
        if s["metric"] == "exact_match" and s.get("f1") is not None:
            shown += f" EM, F1 {s['f1']:.1%}"
        ci = "-" if s["metric"] == "chrf" else f"{s['ci95'][0]:.1%}–{s['ci95'][1]:.1%}"
        n = f"{s['n']} (interrupted)" if s.get("interrupted") else s["n"]
        lines.append(f"| {s['bench']} | {s['label']} | {n} | {shown} | {ci} | {s['ensemble_rate']:.1%} | "
                     f"{s['tokens_per_s']:.2f} | {s['mean_output_tokens']:.0f} | "
                     f"{s.get('seconds_per_question', '-')} | {_forwards(s)} | {s['truncated']} | {s['failures']} | "
                     f"{s['max_new_tokens']} |")
    return "\n".join(lines)


def _forwards(summary: dict[str, Any]) -> str:
    per_member = summary.get("forward_passes_per_token") or {}
    return ", ".join(f"{_short_name(m)} {v:.2f}" for m, v in per_member.items()) or "-"


def plot(summaries: list[dict[str, Any]], folder: Path) -> list[Path]:
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for bench in sorted({s["bench"] for s in summaries}):
        runs = [s for s in summaries if s["bench"] == bench and s["n"]]
        if not runs:
            continue
        labels = [_bar_label(s["label"]) for s in runs]
        chrf = runs[0]["metric"] == "chrf"
        scores = [s["score"] if chrf else 100 * s["score"] for s in runs]
        unit = "chrF" if chrf else "accuracy (%)"
        n = "/".join(sorted({str(s["n"]) for s in runs}))

        # one x position per run (not per label: two runs with one label drew their bars on one spot)
        places = list(range(len(runs)))
        fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(runs)), 4))
        if chrf:
            ax.bar(places, scores, color="tab:blue")
        else:
            low = [100 * (s["score"] - s["ci95"][0]) for s in runs]
            high = [100 * (s["ci95"][1] - s["score"]) for s in runs]
            ax.bar(places, scores, yerr=[low, high], capsize=4, color="tab:blue")
        ax.set_xticks(places, labels)
        ax.set_ylabel(unit)
        ax.set_title(f"{bench}: {unit} per run\nN={n}{'' if chrf else ', error bars: 95% Wilson interval'}",
                     fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        written.append(_save(fig, folder / f"{bench}-accuracy.png"))

        fig, ax = plt.subplots(figsize=(5.5, 4))
        right = max(100 * s["ensemble_rate"] for s in runs)
        gap = 0.08 * ((max(scores) - min(scores)) or 1.0)  # one label line, in data units
        placed: list[tuple[float, float]] = []
        for i in sorted(range(len(runs)), key=lambda i: -scores[i]):  # top labels first
            x, score = 100 * runs[i]["ensemble_rate"], scores[i]
            ax.scatter(x, score, s=40)
            # a label that would print over a nearby one moves down a line, tied to its point
            y = score
            while any(abs(x - px) < 0.3 * (right or 1) and abs(y - py) < gap for px, py in placed):
                y -= gap
            placed.append((x, y))
            ax.annotate(runs[i]["label"], (x, score), xytext=(x + 0.02 * (right or 1), y + 0.15 * gap),
                        textcoords="data", fontsize=7,
                        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "gray"} if y != score else None)
        ax.set_xlim(-0.05 * (right or 1), 1.6 * right + 0.5)   # room for the labels
        ax.margins(y=0.2)
        ax.set_xlabel("ensemble rate (% of tokens fused)")
        ax.set_ylabel(unit)
        ax.set_title(f"{bench}: {unit} vs ensemble rate (N={n})", fontsize=10)
        written.append(_save(fig, folder / f"{bench}-vs-ensemble-rate.png"))

        fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(runs)), 4))
        ax.bar(places, [s["tokens_per_s"] for s in runs], color="tab:orange")
        ax.set_xticks(places, labels)
        ax.set_ylabel("tokens/s (generation incl. prefill)")
        ax.set_title(f"{bench}: speed per run (N={n}; on a shared machine, runs made at\n"
                     "different times compare only roughly)", fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        written.append(_save(fig, folder / f"{bench}-tokens-per-s.png"))
    return written


def _bar_label(label: str) -> str:
    """A run label on a few short lines under its bar (long labels rotated ran into their neighbours)."""
    return "\n".join(textwrap.wrap(label, BAR_LABEL_WIDTH)) or label


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def sign_test(wins: int, losses: int) -> tuple[float, float]:
    """Exact sign test on the discordant pairs (ties dropped): the two-sided p-value, and the
    one-sided p-value for "the run is worse than the baseline" (as many losses or more by chance)."""
    n = wins + losses
    if n == 0:
        return 1.0, 1.0
    tail = [math.comb(n, k) / 2**n for k in range(n + 1)]
    worse = sum(tail[losses:])
    two_sided = min(1.0, 2 * min(sum(tail[: min(wins, losses) + 1]), 1.0))
    return two_sided, worse


class Rescored(NamedTuple):
    """A run's answers by question id, scored again with the current scorer (``benchmarks.stored_scorer``),
    with how many stored verdicts that changed, how many questions are no longer scored and how many
    failed for a passing reason (a member's timeout: no answer, left out, as the summary leaves them)."""

    rows: dict[str, dict[str, Any]]
    changed: int
    dropped: int
    failed: int = 0
    malformed: int = 0
    lines: int = 0
    """Complete lines in the file (the summary records how many it was written at: ``sample_lines``)."""


_RESCORED: dict[tuple[str, int, int, int], Rescored] = {}


def _bench(folder: Path) -> str:
    """A run's benchmark, from its summary, else (a run still going) its config."""
    for name in (SUMMARY, CONFIG):
        file = folder / name
        if file.is_file():
            return str(json.loads(file.read_text()).get("bench", ""))
    return ""


def _is_sample_row(row: dict[str, Any]) -> bool:
    """A JSON line that is a stored answer (a hand edit or another tool's line is not): an id and a verdict."""
    return isinstance(row.get("id"), str) and (isinstance(row.get("correct"), bool)
                                               or isinstance(row.get("value"), int | float))


def _covered(folder: Path) -> set[str] | None:
    """The question ids a run's summary counts, where its samples hold more (``ids``: a run resumed
    with a smaller ``--limit``); None: all of them."""
    try:
        ids = json.loads((folder / SUMMARY).read_text()).get("ids")
    except (OSError, ValueError, AttributeError):
        return None
    return {str(i) for i in ids} if isinstance(ids, list) else None


def rescored(folder: Path) -> Rescored:
    """Every complete line of a run's samples (a run still going, or cut off, may end in a partial
    one; a question asked again on resume stands at the end of the file), re-scored from its
    ``output`` and ``gold``: samples store their verdict, so a run scored before a scoring fix would
    otherwise be compared with one scored after it. Once per version of the file."""
    file = folder / SAMPLES
    stat = file.stat()
    covered = _covered(folder)
    key = (str(file.resolve()), stat.st_mtime_ns, stat.st_size, len(covered) if covered is not None else -1)
    if key not in _RESCORED:
        lines = sample_rows(file)
        rows = {row["id"]: row for row in lines if _is_sample_row(row)}
        malformed = sum(not _is_sample_row(row) for row in lines)
        if covered is not None:  # a run resumed with a smaller --limit: only what its summary counts
            rows = {i: row for i, row in rows.items() if i in covered}
        transient = [i for i, row in rows.items() if is_transient_error(row.get("error"))]
        for i in transient:
            del rows[i]
        score = stored_scorer(_bench(folder))
        translation = is_translation(_bench(folder))
        changed = dropped = 0
        if score is not None:
            for i, row in list(rows.items()):
                if row.get("error") is not None or not row.get("gold"):
                    continue  # a failed answer stays wrong
                if translation and not isinstance(row.get("output"), str):
                    continue  # no output to read the translation from (a row eval did not write): as stored
                new = score(row.get("output") or "", row)
                if new is None:
                    del rows[i]
                    dropped += 1
                    continue
                # translation has no right/wrong: what changes is the translation read from the output
                changed += (new.extracted != row.get("extracted") if translation
                            else bool(new.correct) != bool(row.get("correct")))
                rows[i] = {**row, "extracted": new.extracted, "correct": new.correct, "value": new.value,
                           "f1": new.f1}
        _RESCORED[key] = Rescored(rows, changed, dropped, len(transient), malformed, len(lines))
    return _RESCORED[key]


def _rows(folder: Path) -> dict[str, dict[str, Any]]:
    """A run's answers by question id, re-scored (``rescored``)."""
    return rescored(folder).rows


def _rescore_summary(summary: dict[str, Any]) -> tuple[int, int]:
    """The summary's score, interval and counts from its re-scored samples where re-scoring changed a
    verdict (for translation: a translation read from an output) or dropped a question; (verdicts
    changed, questions dropped)."""
    folder = Path(summary["dir"])
    if not (folder / SAMPLES).is_file():
        return 0, 0
    result = rescored(folder)
    if (result.changed or result.dropped or result.failed) and summary.get("metric") == "chrf":
        # corpus chrF and BLEU from the translations read now, as the run's summary computes them
        rows = list(result.rows.values())
        summary.update(n=len(rows), **corpus_translation([r.get("extracted") or "" for r in rows],
                                                         [(r.get("gold") or [""])[0] for r in rows]))
        summary["score"] = summary["chrf"]
    elif result.changed or result.dropped or result.failed:
        rows = list(result.rows.values())
        n, correct = len(rows), sum(bool(r["correct"]) for r in rows)
        low, high = wilson_interval(correct, n)
        summary.update(n=n, correct=correct, accuracy=round(correct / n, 4) if n else None,
                       ci95=[round(low, 4), round(high, 4)])
        summary["score"] = summary["accuracy"]
        if summary.get("metric") == "exact_match":
            summary["f1"] = round(sum(r.get("f1") or 0.0 for r in rows) / n, 4) if n else None
    return result.changed, result.dropped


def _failed_note(summaries: list[dict[str, Any]]) -> str:
    """One line naming the runs with questions that failed for a passing reason (left out)."""
    parts = [f"{s['label']}: {n}" for s in summaries
             if (n := rescored(Path(s["dir"])).failed if (Path(s["dir"]) / SAMPLES).is_file() else 0)]
    if not parts:
        return ""
    return ("\n\nnote: questions that failed for a passing reason (a member's timeout) are left out of N and the "
            "pairing (rerun with --resume): " + "; ".join(parts))


def _unfinished_note(summaries: list[dict[str, Any]]) -> str:
    """Lines naming the runs that were interrupted (scored on the answers so far), and those whose
    samples hold another number of answers than their summary counts (a run still going, or killed
    before it could write its summary): their row is out of date, while the pairing reads every answer."""
    running = {s["label"]: pid for s in summaries if (pid := lock_holder(Path(s["dir"])))}
    interrupted = [f"{s['label']}: {s['n']} of {s.get('asked', '?')}" for s in summaries
                   if s.get("interrupted") and s["label"] not in running]
    stale, going = [], []
    for s in summaries:
        if not (Path(s["dir"]) / SAMPLES).is_file():
            continue
        result = rescored(Path(s["dir"]))
        if s["label"] in running:
            going.append(f"{s['label']}: {len(result.rows)} answers so far (pid {running[s['label']]})")
        elif len(result.rows) != s["n"]:
            stale.append(f"{s['label']}: {len(result.rows)} answers, the summary counts {s['n']}")
        elif isinstance(lines := s.get("sample_lines"), int) and result.lines != lines:
            # a run resumed with a smaller --limit (``ids``) and stopped before its new summary: equal counts
            stale.append(f"{s['label']}: {result.lines} lines in {SAMPLES}, {lines} when its summary was written")
    note = ""
    if interrupted:
        note += ("\n\nnote: interrupted runs, scored on the questions answered so far (the same eval command "
                 "with --resume continues them): " + "; ".join(interrupted))
    if going:
        note += ("\n\nnote: runs still going (another eval is writing them; their summary is out of date until "
                 "it ends): " + "; ".join(going))
    if stale:
        note += ("\n\nnote: summary out of date (a run still going, or stopped before it wrote its summary; "
                 "--resume rewrites it): " + "; ".join(stale))
    return note


def _malformed_note(summaries: list[dict[str, Any]]) -> str:
    """One line naming the runs whose samples hold JSON lines that are not answers (skipped)."""
    parts = [f"{s['label']}: {n}" for s in summaries
             if (n := rescored(Path(s["dir"])).malformed if (Path(s["dir"]) / SAMPLES).is_file() else 0)]
    if not parts:
        return ""
    return f"\n\nnote: skipped lines of {SAMPLES} that are not answers (no id and verdict): " + "; ".join(parts)


def paired(baseline: Path, other: Path) -> dict[str, Any]:
    """Question by question on the questions both runs answered: where ``other`` wins and loses,
    with the sign test's p-values (``p`` two-sided, ``p_worse`` one-sided). Accuracy and exact
    match compare right/wrong; chrF compares each sentence's chrF (a tie is neither) and adds the
    corpus chrF difference with its paired-bootstrap 95% interval."""
    base, new = _rows(baseline), _rows(other)
    common = [i for i in new if i in base]
    chrf = _is_chrf(baseline)
    wins, losses, both = _discordant(base, new, common, chrf)
    p, p_worse = sign_test(wins, losses)
    result: dict[str, Any] = {"n": len(common), "both_right": both, "wins": wins, "losses": losses,
                              "p": round(p, 4), "p_worse": round(p_worse, 4)}
    if chrf:
        result["chrf_delta"], result["chrf_delta_ci95"] = chrf_difference(
            [base[i] for i in common], [new[i] for i in common])
    else:
        result["accuracy_delta"], result["accuracy_delta_ci95"] = accuracy_difference(wins, losses, both, len(common))
    return result


def accuracy_difference(wins: int, losses: int, both_right: int, n: int) -> tuple[float, tuple[float, float] | None]:
    """The run's accuracy minus the baseline's on the same ``n`` questions, ``(wins - losses) / n``,
    and its 95% interval (None for no question): Newcombe's hybrid score interval for a difference of
    paired proportions (Stat. Med. 1998, method 10), built from the two accuracies' Wilson intervals
    and the correlation of the paired answers. With few discordant questions a bootstrap is too
    narrow (0 / 2 can never resample a win) and an interval given their number alone ignores how
    that number varies; this one is well-behaved at both, and close to the normal one at large N."""
    if n < 0 or min(wins, losses, both_right) < 0 or wins + losses + both_right > n:
        raise InvalidRequestError(f"{wins} wins, {losses} losses and {both_right} both right do not fit "
                                  f"in {n} paired questions")
    if n == 0:
        return 0.0, None
    a, b, c, d = both_right, losses, wins, n - both_right - wins - losses
    run, base = (a + c) / n, (a + b) / n
    run_low, run_high = wilson_interval(a + c, n)
    base_low, base_high = wilson_interval(a + b, n)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    # the correlation of the paired answers, shrunk towards 0 by a continuity correction where positive
    agreement = max(a * d - b * c - n / 2, 0) if a * d > b * c else a * d - b * c
    phi = 0.0 if margins == 0 else agreement / math.sqrt(margins)
    below = math.sqrt(max((run - run_low) ** 2 - 2 * phi * (run - run_low) * (base_high - base)
                          + (base_high - base) ** 2, 0.0))
    above = math.sqrt(max((run_high - run) ** 2 - 2 * phi * (run_high - run) * (base - base_low)
                          + (base - base_low) ** 2, 0.0))
    delta = (wins - losses) / n
    return round(delta, 4), (round(delta - below, 4), round(delta + above, 4))


def _discordant(base: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]], ids: list[str],
                chrf: bool) -> tuple[int, int, int]:
    """(wins, losses, both right) of ``new`` against ``base`` on ``ids``; chrF: a higher / lower
    sentence chrF, and ties instead of both right."""
    if chrf:
        wins = sum(new[i]["value"] > base[i]["value"] for i in ids)
        losses = sum(new[i]["value"] < base[i]["value"] for i in ids)
        return wins, losses, len(ids) - wins - losses
    wins = sum(bool(new[i]["correct"]) and not base[i]["correct"] for i in ids)
    losses = sum(bool(base[i]["correct"]) and not new[i]["correct"] for i in ids)
    return wins, losses, sum(bool(base[i]["correct"] and new[i]["correct"]) for i in ids)


def paired_by_group(baseline: Path, other: Path) -> list[dict[str, Any]]:
    """``paired`` within each group of questions (a BBH task, an MMLU-Redux subject: the samples'
    ``group``), so a gain confined to some tasks is not averaged away. Scores are accuracy, or the
    mean sentence chrF."""
    base, new = _rows(baseline), _rows(other)
    chrf = _is_chrf(baseline)
    groups: dict[str, list[str]] = {}
    for i in new:
        if i in base:
            groups.setdefault(str(base[i].get("group") or "-"), []).append(i)

    def score(rows: dict[str, dict[str, Any]], ids: list[str]) -> float:
        return sum(float(rows[i]["value"] if chrf else bool(rows[i]["correct"])) for i in ids) / len(ids)

    result = []
    for group, ids in sorted(groups.items()):
        wins, losses, _ = _discordant(base, new, ids, chrf)
        result.append({"group": group, "n": len(ids), "baseline": score(base, ids), "run": score(new, ids),
                       "wins": wins, "losses": losses, "p_worse": round(sign_test(wins, losses)[1], 4)})
    return result


def _is_chrf(folder: Path) -> bool:
    """Whether a run is scored by chrF (translation). A run still in progress (or stopped before
    its end) has no summary yet, only its config: there the benchmark's name tells, so that its
    sentences are paired by chrF rather than read as right/wrong answers (which all are "wrong")."""
    summary, config = folder / SUMMARY, folder / CONFIG
    if summary.is_file():
        return json.loads(summary.read_text()).get("metric") == "chrf"
    if config.is_file():
        return is_translation(str(json.loads(config.read_text()).get("bench", "")))
    return False


def chrf_difference(base: list[dict[str, Any]], new: list[dict[str, Any]], resamples: int = 1000,
                    seed: int = 0) -> tuple[float, tuple[float, float]]:
    """Corpus chrF of ``new`` minus ``base`` on the same sentences, and its 95% interval by paired
    bootstrap resampling (Koehn 2004: the same resampled sentences for both runs)."""
    import numpy as np

    from .scoring import _sacrebleu

    _sacrebleu()  # a readable error without the eval extra
    from sacrebleu.metrics import CHRF

    if not base:
        return 0.0, (0.0, 0.0)
    metric = CHRF()
    refs = [[row["gold"][0] for row in base]]
    # per-sentence n-gram statistics: a corpus score of any resample is their sum (as corpus_chrf does)
    stats = [np.array(metric._extract_corpus_statistics([row["extracted"] or "" for row in rows], refs))
             for rows in (base, new)]

    def difference(picks: Any) -> float:
        return float(metric._compute_score_from_stats(list(stats[1][picks].sum(axis=0))).score
                     - metric._compute_score_from_stats(list(stats[0][picks].sum(axis=0))).score)

    rng = np.random.default_rng(seed)
    deltas = sorted(difference(rng.integers(0, len(base), len(base))) for _ in range(resamples))
    return (round(difference(np.arange(len(base))), 2),
            (round(deltas[int(0.025 * resamples)], 2), round(deltas[int(0.975 * resamples) - 1], 2)))


def _paired_columns(chrf: bool) -> tuple[str, str, str]:
    """The paired counts' names: right/wrong answers, or for translation (no right/wrong) the
    sentences whose chrF is tied, higher or lower than the baseline's."""
    if chrf:
        return "sentences tied", "chrF higher here", "chrF higher in baseline"
    return "both right", "right only here", "right only in baseline"


def paired_table(baseline: Path, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """Each run paired with the baseline (``paired``) over the questions both summaries cover (chrF runs:
    per sentence, a higher or lower sentence chrF, plus the corpus chrF difference)."""
    both, wins, losses = _paired_columns(_is_chrf(baseline))
    lines = [f"Paired with {baseline} (the same questions):", "",
             f"| run | N | {both} | {wins} | {losses} | sign test p | p (worse) | Δ score (95% CI) |",
             "|---|---|---|---|---|---|---|---|"]
    for s, p in pairs:
        lines.append(f"| {s['label']} | {p['n']} | {p['both_right']} | {p['wins']} | {p['losses']} "
                     f"| {p['p']:.3f} | {p['p_worse']:.3f} | {_delta_text(p)} |")
    return "\n".join(lines)


def _delta(p: dict[str, Any]) -> tuple[float, tuple[float, float] | None, str]:
    """A ``paired`` result's score difference and interval in the unit it is read in: chrF points,
    or accuracy points (percent; no interval where no question was paired)."""
    if "chrf_delta" in p:
        return p["chrf_delta"], p["chrf_delta_ci95"], "chrF"
    ci = p["accuracy_delta_ci95"]
    return 100 * p["accuracy_delta"], None if ci is None else (100 * ci[0], 100 * ci[1]), "pts"


def _delta_text(p: dict[str, Any]) -> str:
    if not p["n"]:
        return "-"  # no question in common with the baseline
    value, ci, unit = _delta(p)
    return f"{value:+.2f} {unit}" + ("" if ci is None else f" ({ci[0]:+.2f} to {ci[1]:+.2f})")


class PairedDifference(NamedTuple):
    """One point of a paired-difference plot: a run's score minus its baseline's, with the interval."""

    group: str  # the row it is drawn on (a benchmark)
    series: str  # the legend entry (a method or member set)
    unit: str  # the panel it is drawn in ("pts" or "chrF")
    delta: float
    low: float
    high: float
    note: str = ""  # printed beside the point (e.g. "31 / 16")


def paired_difference_plot(points: list[PairedDifference], path: Path, title: str) -> Path:
    """A forest plot: one panel per unit, one row per group holding each of its series' difference
    from the baseline with the 95% interval, and zero marked (left of it: worse than the baseline)."""
    if not points:
        raise InvalidRequestError("nothing to plot: no paired differences")
    plt = _pyplot()
    units = list(dict.fromkeys(p.unit for p in points))
    series = list(dict.fromkeys(p.series for p in points))
    colours = dict(zip(series, plt.rcParams["axes.prop_cycle"].by_key()["color"] * len(series)))
    groups = {u: list(dict.fromkeys(p.group for p in points if p.unit == u)) for u in units}
    lines = {u: sum(1 for p in points if p.unit == u) + len(groups[u]) for u in units}  # a point a line, a gap a group
    fig, axes = plt.subplots(len(units), 1, squeeze=False, figsize=(10, 1.0 + 0.22 * sum(lines.values())),
                             gridspec_kw={"height_ratios": [lines[u] for u in units]})
    for ax, unit in zip(axes[:, 0], units):
        ticks, y = [], 0.0
        for group in groups[unit]:
            mine = [p for p in points if p.unit == unit and p.group == group]
            ticks.append(y + (len(mine) - 1) / 2)
            for p in mine:
                ax.errorbar(p.delta, y, xerr=[[p.delta - p.low], [p.high - p.delta]], fmt="o",
                            color=colours[p.series], capsize=3, markersize=4, label=p.series)
                if p.note:
                    ax.annotate(p.note, (p.high, y), xytext=(4, -3), textcoords="offset points", fontsize=7,
                                color=colours[p.series])
                y += 1
            y += 1  # a blank line between groups
        ax.axvline(0, color="gray", lw=0.8)
        ax.set_yticks(ticks, groups[unit], fontsize=8)
        ax.set_ylim(y - 1, -1)
        low = min(p.low for p in points if p.unit == unit)
        high = max(p.high for p in points if p.unit == unit)
        span = (max(high, 0) - min(low, 0)) or 1.0
        ax.set_xlim(min(low, 0) - 0.05 * span, max(high, 0) + 0.35 * span)  # room for the notes
        ax.set_xlabel("accuracy difference (points)" if unit == "pts" else f"{unit} difference")
    if len(series) > 1:
        unique: dict[str, Any] = {}
        for ax in axes[:, 0]:
            handles, labels = ax.get_legend_handles_labels()
            unique.update(zip(labels, handles))
        axes[0, 0].legend(unique.values(), unique.keys(), fontsize=7, loc="upper left")
    axes[0, 0].set_title(title, fontsize=9)
    return _save(fig, path)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise EnsembleError("the plots need matplotlib: pip install -e '.[eval]' in a clone of safe-ensemble") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


OTHER_BENCH = "another benchmark than the baseline's"
OTHER_DATA = "another data file than the baseline's"
OTHER_EXEMPLARS = "other few-shot exemplar files than the baseline's"
NO_SAMPLES = f"no {SAMPLES} to pair by question"
OTHER_QUESTIONS = "other questions under the same ids than the baseline's"


def _partition(base: dict[str, Any], summaries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                                dict[str, list[str]]]:
    """The runs to pair with the baseline (``base``, its summary): every run but the baseline (however
    its folder was written) on the baseline's benchmark and data; and the labels of the others by why
    not: runs of other benchmarks or data files share question ids ("0", "1", ...) but not questions."""
    own = Path(base["dir"]).resolve()
    same: list[dict[str, Any]] = []
    others: dict[str, list[str]] = {}
    for s in summaries:
        if Path(s["dir"]).resolve() == own:
            continue
        reason = (OTHER_BENCH if s["bench"] != base["bench"] else NO_SAMPLES if not (Path(s["dir"]) / SAMPLES).is_file()
                  else OTHER_DATA if not _same_hash(base, s, "data_sha256")
                  else OTHER_EXEMPLARS if not _same_hash(base, s, "prompt_sha256")
                  else OTHER_QUESTIONS if not _same_questions(Path(base["dir"]), Path(s["dir"])) else None)
        if reason is None:
            same.append(s)
        else:
            others.setdefault(reason, []).append(s["label"])
    return same, others


def _same_hash(base: dict[str, Any], other: dict[str, Any], key: str) -> bool:
    """Whether two runs recorded the same ``key`` hash (``data_sha256``: the data; ``prompt_sha256``: the
    exemplar files the prompts read), where both recorded it: a run stored before a hash was recorded still
    pairs with a new one (the questions tell)."""
    a, b = base.get(key), other.get(key)
    return not (a and b) or a == b


def _asked_text(row: dict[str, Any]) -> str | None:
    """A stored answer's question: its prompt's last user message."""
    prompt = row.get("prompt")
    if not isinstance(prompt, list):
        return None
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else None


def _same_questions(baseline: Path, other: Path) -> bool:
    """Whether every question id both runs answered holds the same gold and (asked with the same prompt
    version) the same question: the backstop for runs that recorded no data hash."""
    if not (baseline / SAMPLES).is_file() or not (other / SAMPLES).is_file():
        return True
    base, new = _rows(baseline), _rows(other)
    for i in new.keys() & base.keys():
        a, b = base[i], new[i]
        if a.get("gold") is not None and b.get("gold") is not None and a["gold"] != b["gold"]:
            return False
        if a.get("prompt_version") == b.get("prompt_version") and _asked_text(a) != _asked_text(b):
            return False
    return True


def _paired_runs(baseline: Path, summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _partition(load_summaries([baseline])[0], summaries)[0]


def _not_paired(others: dict[str, list[str]]) -> str:
    return "".join(f"\n\nnot paired ({reason}): " + "; ".join(labels) for reason, labels in others.items())


def group_tables(baseline: Path, summaries: list[dict[str, Any]]) -> str:
    """One table per run: ``paired_by_group`` against the baseline."""
    # a group's score is the mean sentence chrF (stored as a fraction) or the accuracy
    shown = (lambda v: f"{100 * v:.1f}") if _is_chrf(baseline) else (lambda v: f"{v:.0%}")
    _, wins, losses = _paired_columns(_is_chrf(baseline))
    tables = []
    for s in _paired_runs(baseline, summaries):
        lines = [f"By group, {s['label']} paired with {baseline}:", "",
                 f"| group | N | baseline | this run | {wins} | {losses} | p (worse) |",
                 "|---|---|---|---|---|---|---|"]
        for row in paired_by_group(baseline, Path(s["dir"])):
            lines.append(f"| {row['group']} | {row['n']} | {shown(row['baseline'])} | {shown(row['run'])} | "
                         f"{row['wins']} | {row['losses']} | {row['p_worse']:.3f} |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def compare_runs(dirs: list[Path], plots: Path, json_out: str | None = None, baseline: Path | None = None,
                 by_group: bool = False) -> str:
    if by_group and baseline is None:
        raise InvalidRequestError("--by-group pairs each run with --baseline within each group: give --baseline")
    _check_outputs(plots, json_out)
    dirs, skipped, unanswered = _runs_only(dirs)
    dirs, pending = _summarized(dirs)
    summaries = load_summaries(dirs)
    if baseline is not None:
        base = load_summaries([baseline])[0]  # a baseline without a summary: the error, as a lone run's
        baseline = Path(base["dir"])  # a summary.json given: its run's folder
        if all(Path(s["dir"]).resolve() != baseline.resolve() for s in summaries):
            summaries = load_summaries([baseline, *dirs])  # its row in the table too (labels told apart with them)
    rescoring = [_rescore_summary(s) for s in summaries]
    written = plot(summaries, plots)
    if json_out:
        Path(json_out).write_text(json.dumps(summaries, indent=2) + "\n")
    text = table(summaries)
    if baseline is not None:
        if not (baseline / SAMPLES).is_file():
            raise InvalidRequestError(f"--baseline {baseline} has no {SAMPLES} to pair the runs with by question")
        matched, others = _partition(base, summaries)
        pairs = [(s, paired(baseline, Path(s["dir"]))) for s in matched]  # once: chrF's bootstrap is slow
        # no run to pair: a sentence, not a table header with no rows (nor --by-group's blank lines)
        text += "\n\n" + (paired_table(baseline, pairs) if pairs else f"no run pairs with {baseline} (the same "
                            "questions): " + ("see why below" if others else "no other run was given"))
        text += _not_paired(others)
        written.extend(_paired_plot(base, pairs, plots))
        if by_group and pairs:
            text += "\n\n" + group_tables(baseline, summaries)
    skipped_note = (f"\n\nnote: skipped {', '.join(str(d) for d in skipped)} (no {SUMMARY} or {CONFIG}: "
                    "not an eval run)") if skipped else ""
    if unanswered:
        skipped_note += (f"\n\nnote: skipped {', '.join(str(d) for d in unanswered)} (a run that answered no "
                         "question: its start failed)")
    skipped_note += "".join(f"\n\nnote: skipped {folder} (no {SUMMARY} yet: {why})" for folder, why in pending)
    return (text + _mixed_prompts_note(summaries) + _rescored_note(summaries, rescoring) + _failed_note(summaries)
            + _malformed_note(summaries) + _unfinished_note(summaries)
            + skipped_note
            + "\n\nplots: " + ", ".join(str(p) for p in written))


def _check_outputs(plots: Path, json_out: str | None) -> None:
    """``--plots`` and ``--json`` can be written: checked before the table and plots are made, not after."""
    if json_out:
        check_output_file(Path(json_out), "--json", "rows JSON")
    if plots.exists() and not plots.is_dir():
        raise InvalidRequestError(f"--plots {plots} is a file: give a folder for the plots")
    try:
        plots.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidRequestError(f"--plots {plots}: cannot make the folder ({err.strerror})") from None


def _runs_only(dirs: list[Path]) -> tuple[list[Path], list[Path], list[Path]]:
    """The given folders less those that are no eval run at all (the plots folder, which the first
    ``compare runs/*`` writes into ``runs/``, so the next ``runs/*`` glob picks it up) and runs that
    never answered a question (``config.json`` only: a start that failed, e.g. a misspelt model); and
    those two lists. A run's folder with answers but no summary, or one whose eval holds its lock (loading
    its members, no answer yet: still going, not failed), is kept: ``_summarized`` says why it has none."""
    keep: list[Path] = []
    skipped: list[Path] = []
    unanswered: list[Path] = []
    for folder in dirs:
        summary, samples = folder / SUMMARY, folder / SAMPLES
        if not folder.is_dir() or summary.exists():
            keep.append(folder)
        elif not (folder / CONFIG).exists():
            skipped.append(folder)
        elif (not samples.exists() or not samples.stat().st_size) and not lock_holder(folder):
            unanswered.append(folder)
        else:
            keep.append(folder)
    if not keep:
        raise InvalidRequestError(f"no {SUMMARY} in {', '.join(str(d) for d in dirs)}")
    return keep, skipped, unanswered


def _summarized(dirs: list[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The runs with a summary, and each run's folder without one yet with why (on its first pass, or
    killed before its first summary): ``compare runs/*`` while one run is going compares the others,
    noting it. Where none has one, the error says why (a lone run given, as before)."""
    keep: list[Path] = []
    pending: list[tuple[Path, str]] = []
    for folder in dirs:
        why = _why_no_summary(folder) if folder.is_dir() and not (folder / SUMMARY).exists() else ""
        if why:
            pending.append((folder, why))
        else:
            keep.append(folder)  # a summary, or a path load_summaries refuses with its own message
    if not keep:
        raise InvalidRequestError("; ".join(f"no {SUMMARY} in {folder} ({why})" for folder, why in pending))
    return keep, pending


def _rescored_note(summaries: list[dict[str, Any]], rescoring: list[tuple[int, int]]) -> str:
    """One line where scoring the stored answers again with the current scorer changed something."""
    parts = [f"{s['label']}: {changed} " + ("translation(s) read differently" if s.get("metric") == "chrf"
                                            else "verdict(s) changed")
             + (f", {dropped} question(s) no longer scored" if dropped else "")
             for s, (changed, dropped) in zip(summaries, rescoring) if changed or dropped]
    if not parts:
        return ""
    return "\n\nnote: stored answers re-scored with the current scorer (the table uses these): " + "; ".join(parts)


def _paired_plot(base: dict[str, Any], pairs: list[tuple[dict[str, Any], dict[str, Any]]],
                 folder: Path) -> list[Path]:
    """``{bench}-paired.png``: each run's difference from the baseline, with its interval."""
    points = []
    for s, p in pairs:
        if p["n"]:  # a run that shares no question with the baseline has no difference to draw
            value, ci, unit = _delta(p)
            low, high = ci if ci is not None else (value, value)
            points.append(PairedDifference(s["label"], "run", unit, value, low, high, f"{p['wins']} / {p['losses']}"))
    if not points:
        return []
    bench = base["bench"]
    folder.mkdir(parents=True, exist_ok=True)
    counts = ("sentences with a higher / lower chrF in the run" if base["metric"] == "chrf"
              else "questions right only in the run / only in the baseline")
    title = (f"{bench}: each run minus {base['label']}, paired, 95% interval\n"
             f"(beside each point: {counts})")
    return [paired_difference_plot(points, folder / f"{bench}-paired.png", title)]


def _mixed_prompts_note(summaries: list[dict[str, Any]]) -> str:
    """A warning when the runs were asked with different prompt versions (prompts.PROMPT_VERSION):
    their rows may not compare, and nothing else in the table would show it."""
    versions: dict[str, list[str]] = {}
    for s in summaries:
        versions.setdefault(s.get("prompt_version") or "unknown", []).append(run_label(s))
    if len(versions) < 2:
        return ""
    return "\n\nnote: the runs used different prompt versions: " + "; ".join(
        f"{version}: {', '.join(labels)}" for version, labels in sorted(versions.items()))
