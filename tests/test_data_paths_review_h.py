"""Review of the newcomer fixes (review h): ``--data`` errors that pointed at the wrong place or hid the
way out, another benchmark's file loaded without a word, and ChatEnsemble's unknown-argument message
silent where the argument has a home (a member's setting, a per-request keyword, ChatOpenAI's name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from langchain_ensemble import ChatEnsemble
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation import datasets
from shared_engine.evaluation.benchmarks import get_benchmark


def _qa_prompts(root: Path) -> None:
    """The open-QA prompt files a data file in a folder under ``root`` finds beside it (a clone has no data folder
    to fall back on)."""
    for name in ("nq_prompt.txt", "squad_prompt.txt", "triviaqa_prompt.txt"):
        prompt = root / "prompts" / "adafuse" / name
        prompt.parent.mkdir(parents=True, exist_ok=True)
        prompt.write_text("Instructions: answer briefly.\n\nQuestion: Who wrote Hamlet?\nAnswer: Shakespeare\n")


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _flores_rows() -> list[dict[str, object]]:
    return [{"id": i, "question": f"Good morning {i}.", "answer": f"Guten Morgen {i}."} for i in range(3)]


def _gsm8k_rows() -> list[dict[str, object]]:
    return [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(3)]


@pytest.mark.parametrize("inside", ["", "flores"])
def test_flores_folder_without_the_pairs_file_names_the_folder(inside: str, tmp_path: Path) -> None:
    """A folder holding only flores/en-de.jsonl, run for en-ro: "benchmark file not found: <folder>/en-ro.jsonl"
    (a place nothing looks in) instead of the no-data message every other benchmark gives."""
    _write_jsonl(tmp_path / "flores" / "en-de.jsonl", _flores_rows())
    folder = tmp_path / inside
    with pytest.raises(InvalidRequestError) as caught:
        get_benchmark("flores", str(folder), "en-ro").dataset()
    message = str(caught.value)
    assert message.startswith(f"{folder}: a folder, but it holds neither flores/en-ro.jsonl nor en-ro.jsonl ")
    assert "--data takes the data folder, the flores folder or a FLORES en-ro.jsonl file" in message
    assert get_benchmark("flores", str(folder), "en-de").dataset().records[0].answers == ["Guten Morgen 0."]


def test_a_link_to_a_missing_file_says_so(tmp_path: Path) -> None:
    """git-annex data not fetched: gsm8k/test.jsonl a dangling link, which ``ls`` lists, was said not to be in
    the folder (``exists`` follows the link)."""
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").symlink_to(tmp_path / "annex" / "object")
    for data in (tmp_path, tmp_path / "gsm8k"):
        with pytest.raises(InvalidRequestError, match=r"gsm8k/test\.jsonl is a link to a missing file .*annex"):
            get_benchmark("gsm8k", str(data)).dataset()


def test_gsm8k_without_data_mentions_the_shipped_sample(tmp_path: Path) -> None:
    """A first run without the data folder was not told of ``--data sample``."""
    with pytest.raises(InvalidRequestError, match="--data sample runs the GSM8K sample the package ships"):
        get_benchmark("gsm8k", str(tmp_path)).dataset()
    assert len(get_benchmark("gsm8k", "sample").dataset().records) == 32


@pytest.mark.parametrize("bench", ["nq", "triviaqa", "squad"])
def test_open_qa_refuses_a_gsm8k_file(bench: str, tmp_path: Path) -> None:
    """--bench nq on gsm8k/test.jsonl loaded its 923 rows, each worked solution an alias no answer matches."""
    gsm8k = _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", _gsm8k_rows())
    with pytest.raises(InvalidRequestError, match=r"test\.jsonl row 0: an answer holding GSM8K's '####'"):
        get_benchmark(bench, str(gsm8k)).dataset()


def test_open_qa_refuses_a_flores_file_and_keeps_its_own(tmp_path: Path) -> None:
    """--bench squad on flores/en-de.jsonl loaded 708 sentence pairs as questions with one alias each."""
    flores = _write_jsonl(tmp_path / "flores" / "en-de.jsonl", _flores_rows())
    with pytest.raises(InvalidRequestError, match=r"en-de\.jsonl: a translation file .*--bench flores reads it"):
        get_benchmark("squad", str(flores)).dataset()
    _qa_prompts(tmp_path)
    single = _write_jsonl(tmp_path / "own" / "mine.jsonl", _flores_rows())  # one string answer, not named as a pair
    assert len(get_benchmark("nq", str(single)).dataset().records) == 3
    aliases = _write_jsonl(tmp_path / "qa" / "en-de.jsonl", [{"question": "who?", "answer": ["a", "b"]}])
    assert get_benchmark("nq", str(aliases)).dataset().records[0].answers == ["a", "b"]
    with pytest.raises(InvalidRequestError, match="a translation file"):  # the loader itself, too
        datasets.load_qa(flores, "squad")


def test_flores_refuses_a_gsm8k_file(tmp_path: Path) -> None:
    """--bench flores on gsm8k/test.jsonl loaded its questions as sentences, its solutions as references."""
    gsm8k = _write_jsonl(tmp_path / "test.jsonl", _gsm8k_rows())
    with pytest.raises(InvalidRequestError, match=r"test\.jsonl row 0: an answer holding GSM8K's '####'"):
        get_benchmark("flores", str(gsm8k), "en-de").dataset()


def test_a_users_own_files_are_read_whatever_their_names(tmp_path: Path) -> None:
    """Review: the refusals of another benchmark's file refused a user's own data: any QA file named like
    a pair ("my-qa.jsonl", "dev-set.jsonl", "en-de.jsonl") with string answers, a translation file without ids."""
    own_qa = [{"question": f"Who wrote {i}?", "answer": f"Author {i}"} for i in range(3)]
    _qa_prompts(tmp_path)
    for name in ("my-qa", "dev-set", "nq-dev", "en-de"):
        path = _write_jsonl(tmp_path / "own" / f"{name}.jsonl", own_qa)
        assert len(get_benchmark("squad", str(path)).dataset().records) == 3
    no_ids = [{"question": f"Good morning {i}.", "answer": f"Guten Morgen {i}."} for i in range(3)]
    path = _write_jsonl(tmp_path / "mine" / "en-de.jsonl", no_ids)
    assert [r.id for r in get_benchmark("flores", str(path)).dataset().records] == ["0", "1", "2"]


def test_mmlu_on_a_bbh_file_is_a_short_error(tmp_path: Path) -> None:
    """A BBH task (one JSON line) read as an MMLU-Redux sheet: the error quoted its whole header, 61 KB."""
    task = tmp_path / "navigate.json"
    task.write_text(json.dumps({"canary": "x" * 100, "examples": [{"input": "q, " * 5000, "target": "Yes"}]}))
    with pytest.raises(InvalidRequestError, match="not an MMLU-Redux sheet") as caught:
        get_benchmark("mmlu-redux", str(task)).dataset()
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize(("given", "hint"), [
    ({"n_ctx": 2048}, "(n_ctx is set per member: members=[{'model': 'a', 'n_ctx': 2048}, ...] instead of models)"),
    ({"backend": "llamacpp"}, "(backend is set per member: members=[{'model': 'a', 'backend': 'llamacpp'}, "),
    ({"threads": 4}, "(threads is set per member: "),
    ({"tools": []}, "(tools are bound per request: llm.bind_tools([...]))"),
    ({"tool_choice": "auto"}, "llm.bind_tools([...], tool_choice=...)"),
    ({"response_format": {"type": "json_object"}}, "llm.with_structured_output(schema)"),
    ({"keep_events": True}, "custom_events=[...]"),
    ({"max_completion_tokens": 5}, "(did you mean 'max_tokens'?)"),
])
def test_chat_ensemble_says_where_an_unknown_argument_goes(given: dict[str, object], hint: str) -> None:
    """A member's own setting, a per-request keyword or ChatOpenAI's length name was "not a ... member option"
    with no hint."""
    with pytest.raises(ValueError, match="unknown arguments") as caught:
        ChatEnsemble(models=["a", "b"], **given)
    assert hint in str(caught.value)


def test_a_per_member_setting_works_as_the_hint_says() -> None:
    """The hint's spelling is what the constructor takes (no weights are loaded here)."""
    llm = ChatEnsemble(members=[{"model": "smollm2-135m-instruct", "n_ctx": 2048}, "gemma-3-270m"])
    try:
        assert llm.members is not None and llm.members[0].n_ctx == 2048
    finally:
        llm.close()
