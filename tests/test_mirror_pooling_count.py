"""scripts/mirror_pooling_count.py: the mirror case it counts (README Results, TriviaQA) on the measured example,
with stand-in tables: the drafter has " Kilim" as one token, the verifier writes it " Kil" + "im"."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from shared_engine.events import Candidate, EnsembleEvent

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mirror_pooling_count.py"


class Pieces:
    """Just what ``fusion._first_piece`` reads of a TokenTable: whole tokens, and an own tokenization."""

    def __init__(self, pieces: list[bytes], splits: dict[str, list[int]]) -> None:
        self.pieces, self._splits = pieces, splits

    def token_id(self, text: bytes) -> int | None:
        return self.pieces.index(text) if text in self.pieces else None

    def encode_fragment(self, text: str) -> list[int]:
        return self._splits[text]


def _script():  # noqa: ANN202 - the module
    spec = importlib.util.spec_from_file_location("mirror_pooling_count", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _event(drafted: str = " Kilim") -> EnsembleEvent:
    def cand(text: str, gemma: float, qwen: float) -> Candidate:
        return Candidate(text=text, member_probs={"gemma": gemma, "qwen": qwen}, fused=2 / 3 * gemma + qwen / 3)
    return EnsembleEvent(position=1, offset=5, sharpened=True, chosen=" Everest", drafted=drafted, changed=True,
                         candidates=[cand(" Everest", 0.07, 0.66), cand(" Kilim", 0.38, 0.0), cand(" Kil", 0.0, 0.19)])


def test_a_verifiers_first_piece_of_the_drafters_word_backs_that_word() -> None:
    module = _script()
    weights = {"gemma": 2 / 3, "qwen": 1 / 3}
    gemma = Pieces([b" Everest", b" Kilim", b" Kil"], {})
    qwen = Pieces([b" Everest", b" Kil", b"im"], {" Kilim": [1, 2]})
    bonus = module.mirror_bonus(_event(), {"gemma": gemma, "qwen": qwen}, weights, "gemma")
    assert bonus == {" Kilim": pytest.approx(0.19 / 3)}  # 0.253 + 0.063 = 0.317 > " Everest" 0.267
    # where the drafter itself writes the word through the piece, heur pools it already: nothing to add
    gemma_splits = Pieces([b" Everest", b" Kil", b"im"], {" Kilim": [1, 2]})
    assert module.mirror_bonus(_event(), {"gemma": gemma_splits, "qwen": qwen}, weights, "gemma") == {}
    # a verifier whose own tokenization of the word does not start with the piece backs nothing
    other = Pieces([b" Everest", b" Ki", b"lim", b" Kil"], {" Kilim": [1, 2]})
    assert module.mirror_bonus(_event(), {"gemma": gemma, "qwen": other}, weights, "gemma") == {}


def test_the_script_runs() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "--limit" in done.stdout
