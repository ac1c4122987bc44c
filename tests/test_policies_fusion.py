"""Consensus rule and fusion on hand-made distributions (no models needed)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_engine.alignment import EOS_KEY, TokenTable
from shared_engine.fusion import Fused, cuts_a_word, drafter_extends, plausible, sharpen
from shared_engine.policies import DraftSchedule, agree, make_policy
from shared_engine.sampling import Sampler
from tests.toy import byte_level_tokenizer, metaspace_tokenizer, toy_member


@st.composite
def member_distributions(draw: st.DrawFn) -> torch.Tensor:
    """2-4 members over a shared 6-token vocabulary; member 0 is a greedy drafter."""
    members = draw(st.integers(2, 4))
    weights = draw(st.lists(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
                            min_size=members, max_size=members))
    probs = torch.tensor(weights, dtype=torch.float64) + 1e-6
    return probs / probs.sum(dim=1, keepdim=True)


@settings(max_examples=500, deadline=None, derandomize=os.environ.get("HYPOTHESIS_EXPLORE") != "1")
@given(member_distributions())
def test_consensus_skip_never_changes_arithmetic_mean_argmax(probs: torch.Tensor) -> None:
    drafted = int(torch.argmax(probs[0]))  # greedy drafter proposes its own argmax
    own = [float(p[drafted]) for p in probs]
    tops = [int(torch.argmax(p)) == drafted for p in probs]
    if agree(own, tops, torch.full((probs.shape[0],), 1 / probs.shape[0], dtype=torch.float64)):
        mean = probs.mean(dim=0)
        assert float(mean[drafted]) >= float(mean.max()) - 1e-12


def test_consensus_rule_cases() -> None:
    even2, even3 = torch.tensor([0.5, 0.5]), torch.full((3,), 1 / 3)
    assert agree([0.3, 0.2], [True, True], even2)  # unanimous argmax, however unsure
    assert agree([0.9, 0.2], [True, False], even2)  # mean 0.55 > 0.5
    assert not agree([0.6, 0.4], [True, False], even2)  # mean exactly 0.5 is not enough
    assert not agree([0.5, 0.1, 0.2], [True, False, False], even3)


def test_consensus_uses_the_fusion_weights() -> None:
    """Issue #16: with weights 0.2/0.8 the weighted mean of 0.95 and 0.1 is 0.27, so fusion could
    well pick another token; the unweighted mean (0.525) used to skip the position."""
    weights = torch.tensor([0.2, 0.8])
    assert not agree([0.95, 0.1], [True, False], weights)
    assert agree([0.1, 0.95], [False, True], weights)  # weighted mean 0.78


@settings(max_examples=300, deadline=None, derandomize=os.environ.get("HYPOTHESIS_EXPLORE") != "1")
@given(member_distributions(), st.lists(st.floats(0.01, 1.0), min_size=4, max_size=4))
def test_weighted_consensus_skip_never_changes_the_weighted_mean_argmax(probs: torch.Tensor,
                                                                       raw: list[float]) -> None:
    weights = torch.tensor(raw[: probs.shape[0]], dtype=torch.float64)
    weights = weights / weights.sum()
    drafted = int(torch.argmax(probs[0]))
    own = [float(p[drafted]) for p in probs]
    tops = [int(torch.argmax(p)) == drafted for p in probs]
    if agree(own, tops, weights):
        mean = weights @ probs
        assert float(mean[drafted]) >= float(mean.max()) - 1e-12


def _fused(keys: list[bytes], member_probs: list[list[float]], weights: list[float]) -> tuple[Fused, torch.Tensor]:
    w = torch.tensor(weights)
    mp = torch.tensor(member_probs)
    return Fused(keys, mp, w @ mp), w


def test_heur_sharpening_pools_extensions_onto_drafter_prefix() -> None:
    keys = [b" Sofia", b" So", b" Paris", b" S"]
    fused, w = _fused(keys, [[0.35, 0.30, 0.35, 0.0], [0.1, 0.15, 0.45, 0.3]], [0.5, 0.5])
    assert float(fused.fused.max()) < 0.5
    scores, fired = sharpen(fused, w, "heur", drafter_top={b" Sofia", b" So", b" Paris"})
    assert fired
    # " So" gains " Sofia"'s mass; " S" is not in the drafter's top-10 so it pools nothing.
    assert keys[int(torch.argmax(scores))] == b" So"
    assert torch.isclose(scores[1], fused.fused[1] + fused.fused[0])
    assert torch.isclose(scores[3], fused.fused[3])


def test_heur_pools_only_extensions_the_drafter_writes_after_the_shorter_token() -> None:
    """" and" is not " a" continued: the released rule pooled its mass onto " a" (the answer then
    read " a" and the drafter went on with " cat"; measured in a JSON string, "A cat is a cat, a
    cat is ..." to the cap). Only a longer candidate that the drafter's own tokenizer starts with
    the shorter token is pooled onto it."""
    byte_level, metaspace = TokenTable(byte_level_tokenizer()), TokenTable(metaspace_tokenizer())
    assert byte_level.token_id(b" and") is not None and byte_level.token_id(b" a") is not None
    assert not drafter_extends(byte_level)(b" and", b" a")  # the drafter writes " and" in one token
    assert drafter_extends(byte_level)(b" then", b" the")  # " the" + "n" in this vocabulary
    assert drafter_extends(metaspace)(b" Sofia", b" So")  # " So" + "fia"
    assert not drafter_extends(metaspace)(b" Some", b" So")  # its own token " Some"
    assert drafter_extends(metaspace)(b" \xe2\x82", b" ")  # not whole UTF-8: pooled as released
    assert metaspace.token_id(b" Paris,") is not None
    assert drafter_extends(metaspace)(b" Paris,", b" Paris")  # cut at a word's edge: pooled, one token or not
    assert cuts_a_word(b"```", b"`") and cuts_a_word(b" 10", b" 1") and cuts_a_word(b"\n\n", b"\n")
    assert cuts_a_word(b"e\xcc\x81", b"e") and cuts_a_word(b" \xe2\x82", b" ") is None  # a mark; not UTF-8
    assert not cuts_a_word(b'"The', b'"') and not cuts_a_word(b".\n", b".")
    keys = [b" and", b" but", b" a"]
    fused, w = _fused(keys, [[0.26, 0.31, 0.10], [0.34, 0.06, 0.38]], [2 / 3, 1 / 3])
    released, fired = sharpen(fused, w, "heur", drafter_top=set(keys))
    assert fired and keys[int(torch.argmax(released))] == b" a"  # 0.19 + 0.29 pooled
    scores, fired = sharpen(fused, w, "heur", drafter_top=set(keys), extends=drafter_extends(byte_level))
    assert fired and keys[int(torch.argmax(scores))] == b" and" and torch.equal(scores, fused.fused)
    as_released, _ = sharpen(fused, w, "heur-bytes", drafter_top=set(keys), extends=drafter_extends(byte_level))
    assert torch.equal(as_released, released)  # the option that keeps the released code's pooling


def test_heur_pools_a_word_after_punctuation_onto_the_punctuation() -> None:
    """Measured on FLORES de-en (Qwen drafts, Gemma-3-270m base verifies): at the translation's first
    word Qwen split its mass between '"' and '"The' (one token in its vocabulary), and Gemma's "User"
    (a base model going on with the dialogue) won and ended the answer. '"The' is '"' and then a word
    of its own, so it pools onto '"' whatever the drafter's vocabulary merges."""
    byte_level = TokenTable(byte_level_tokenizer())
    keys = [b'"', b'"The', b"User"]
    fused, w = _fused(keys, [[0.261, 0.228, 0.0], [0.0, 0.0, 0.584]], [2 / 3, 1 / 3])
    assert keys[int(torch.argmax(fused.fused))] == b"User"
    scores, fired = sharpen(fused, w, "heur", drafter_top={b'"', b'"The'}, extends=drafter_extends(byte_level))
    assert fired and keys[int(torch.argmax(scores))] == b'"'
    assert torch.isclose(scores[0], fused.fused[0] + fused.fused[1])


def test_heur_pools_a_verifiers_first_piece_onto_the_drafters_word() -> None:
    """The mirror of the rule above, measured on TriviaQA (Gemma-3-270m drafts " Kilim" as one token at
    0.38; Qwen writes " Kil" + "im" and gives " Kil" 0.19; " Everest" won and the answer was lost).
    Here the metaspace drafter has " Peter" as one token and the byte-level verifier writes " P" +
    "eter": the verifier's " P" counts for " Peter", never for a piece the drafter would not write."""
    metaspace, byte_level = TokenTable(metaspace_tokenizer()), TokenTable(byte_level_tokenizer())
    assert metaspace.token_id(b" Peter") is not None
    assert byte_level.encode_fragment(" Peter")[:1] == [byte_level.token_id(b" P")]
    keys = [b" Peter", b" Paul", b" P"]
    fused, w = _fused(keys, [[0.38, 0.30, 0.0], [0.0, 0.25, 0.40]], [2 / 3, 1 / 3])
    top = {b" Peter", b" Paul"}
    plain, fired = sharpen(fused, w, "heur", drafter_top=top, extends=drafter_extends(metaspace))
    assert fired and keys[int(torch.argmax(plain))] == b" Paul"  # without the members' tables: as before
    tables = [metaspace, byte_level]
    scores, fired = sharpen(fused, w, "heur", drafter_top=top, extends=drafter_extends(metaspace), tables=tables)
    assert fired and keys[int(torch.argmax(scores))] == b" Peter"
    assert torch.isclose(scores[0], fused.fused[0] + w[1] * 0.40) and torch.equal(scores[1:], fused.fused[1:])
    same, _ = sharpen(fused, w, "heur", drafter_top=top, extends=drafter_extends(metaspace),
                      tables=[metaspace, metaspace])  # a verifier that writes " Peter" whole: nothing to pool
    assert torch.equal(same, fused.fused)
    not_drafters, _ = sharpen(fused, w, "heur", drafter_top={b" Paul"}, extends=drafter_extends(metaspace),
                              tables=tables)  # not a candidate of the drafter's own
    assert torch.equal(not_drafters, fused.fused)
    released, _ = sharpen(fused, w, "heur-bytes", drafter_top=top, extends=drafter_extends(metaspace),
                          tables=tables)  # the released pooling has no mirror
    assert torch.equal(released, fused.fused)


def test_geom_sharpening_and_no_sharpening_when_confident() -> None:
    fused, w = _fused([b"a", b"b"], [[0.45, 0.55], [0.5, 0.5]], [0.5, 0.5])
    scores, fired = sharpen(fused, w, "geom", drafter_top={b"a", b"b"})
    assert not fired and torch.equal(scores, fused.fused)  # fused max 0.525 >= 0.5
    fused, w = _fused([b"a", b"b", EOS_KEY], [[0.45, 0.1, 0.45], [0.05, 0.5, 0.45]], [0.5, 0.5])
    scores, fired = sharpen(fused, w, "geom", drafter_top={b"a", b"b"})
    assert fired
    # arithmetic mean prefers "b"/EOS ties near 0.3; the geometric mean punishes "a" and "b" for one
    # member's low probability and picks EOS, which both members rate 0.45.
    assert int(torch.argmax(scores)) == 2


def test_policies_are_the_documented_methods() -> None:
    five = DraftSchedule.fixed(5)
    safe = make_policy("safe", five, 0.5)
    assert (safe.draft, safe.verify_draft, safe.require_boundary, safe.skip_consensus) == (five, True, True, True)
    every = make_policy("every-token", DraftSchedule.adaptive(5, 16), 0.5)
    assert (every.draft, every.require_boundary, every.skip_consensus) == (DraftSchedule.fixed(1), False, False)
    gac = make_policy("gac-threshold", five, 0.4)
    assert gac.draft == DraftSchedule.fixed(1)
    assert gac.needs_verification(lambda: 1 / 3) and not gac.needs_verification(lambda: 0.4)  # the drafted token's
    single = make_policy("single", DraftSchedule.adaptive(6, 16), 0.5)
    assert not single.needs_verification(lambda: 0.0) and single.draft == DraftSchedule.fixed(6)


def test_sampler_seeded_is_reproducible_and_top_p_restricts() -> None:
    logits = torch.tensor([2.0, 1.9, -5.0, -5.0])
    a = [Sampler(1.0, 1.0, seed=7).from_logits(logits) for _ in range(1)]
    b = [Sampler(1.0, 1.0, seed=7).from_logits(logits) for _ in range(1)]
    assert a == b
    nucleus = Sampler(1.0, top_p=0.5, seed=1)
    assert {nucleus.from_logits(logits) for _ in range(50)} == {0}
    assert Sampler(0.0).from_logits(logits) == 0


# ----------------------------------------------------------------- fusion across real vocabularies (toy)

def _dist(name: str, kind: str, mass: dict[bytes, float]):  # noqa: ANN202
    from shared_engine.fusion import MemberDist
    from tests.toy import toy_member

    table = toy_member(name, kind).table
    logits = torch.full((table.vocab_size,), -20.0)
    for piece, logit in mass.items():
        token = table.token_id(piece) if piece != EOS_KEY else next(iter(table.eos_ids))
        assert token is not None, piece
        logits[token] = logit
    return MemberDist(name, table, logits)


def test_unite_rescores_a_missing_word_through_the_first_subtoken() -> None:
    from shared_engine.fusion import UniteFusion

    byte_level = _dist("bl", "byte_level", {b" Sofia": 5.0, b" Paris": 3.0})
    metaspace = _dist("ms", "metaspace", {b" So": 4.0, b" Paris": 4.0})
    fused = UniteFusion(top_k=2)([byte_level, metaspace], torch.tensor([0.5, 0.5]))
    assert set(fused.keys) == {b" Sofia", b" Paris", b" So"}
    sofia, so = fused.keys.index(b" Sofia"), fused.keys.index(b" So")
    # metaspace has no " Sofia" token; its first sub-token " So" is already a candidate of its own,
    # so that probability is given once, to " So", as UniTE's released code does
    assert float(fused.member_probs[1, so]) == pytest.approx(0.5, abs=1e-4)
    assert float(fused.member_probs[1, sofia]) == 0.0
    assert torch.allclose(fused.member_probs.sum(dim=1), torch.ones(2))
    assert fused.keys[int(torch.argmax(fused.fused))] == b" Sofia"


def test_unite_gives_a_shared_first_subtoken_its_probability_once() -> None:
    """Issue #16: " wrote" and " walked" are whole tokens of the byte-level drafter and both start
    with " w" in the metaspace vocabulary. Re-scoring each through " w" used to hand the metaspace
    member's " w" probability to both, so a word from another vocabulary could win on prefix mass
    counted twice. Now the first candidate in union order gets it, the second gets nothing."""
    from shared_engine.fusion import UniteFusion

    byte_level = _dist("bl", "byte_level", {b" wrote": 5.0, b" walked": 4.9})
    metaspace = _dist("ms", "metaspace", {b" Paris": 5.0, b" So": 4.5, b" w": 4.0})
    fused = UniteFusion(top_k=2)([byte_level, metaspace], torch.tensor([0.5, 0.5]))
    assert fused.keys == [b" wrote", b" walked", b" Paris", b" So"]
    ms = fused.member_probs[1]
    assert float(ms[1]) == 0.0  # " walked": its " w" was already spent on " wrote"
    expected = torch.softmax(torch.tensor([4.0, 5.0, 4.5]), 0)  # " w", " Paris", " So"
    assert torch.allclose(ms[[0, 2, 3]], expected, atol=1e-5)
    assert float(fused.fused.sum()) == pytest.approx(1.0, abs=1e-5)


def test_gac_union_matches_exact_strings_and_pools_eos() -> None:
    from shared_engine.fusion import GacFusion

    byte_level = _dist("bl", "byte_level", {b" Sofia": 5.0, EOS_KEY: 5.0})
    metaspace = _dist("ms", "metaspace", {b" So": 5.0, EOS_KEY: 5.0})
    fused = GacFusion(num_candidates=4)([byte_level, metaspace], torch.tensor([0.5, 0.5]))
    probs = dict(zip(fused.keys, fused.fused.tolist()))
    # no string match for " Sofia" in metaspace: GaC only transfers exact strings
    assert probs[b" Sofia"] == pytest.approx(0.25, abs=1e-3)
    assert probs[b" So"] == pytest.approx(0.25, abs=1e-3)
    assert probs[EOS_KEY] == pytest.approx(0.5, abs=1e-3)  # "end of answer" is one candidate


# ----------------------------------------------------------------- each baseline as its paper defines it

@pytest.mark.parametrize(("method", "fusion", "sharpen"), [
    ("safe", "unite", "heur"),  # sharpening is SAFE's
    ("every-token", "unite", None),  # UniTE at every step, plain weighted mean
    ("gac-threshold", "gac", None),  # GaC's union vocabulary behind its gate
    ("adafuse", "unite", None),
    ("single", "unite", None),
])
def test_each_method_defaults_to_its_papers_fusion_and_sharpening(method: str, fusion: str,
                                                                  sharpen: str | None) -> None:
    from shared_engine.options import EngineOptions

    options = EngineOptions(method=method)
    assert (options.fusion, options.sharpen) == (fusion, sharpen)


def test_explicit_fusion_and_sharpening_still_win() -> None:
    from shared_engine.options import EngineOptions

    assert EngineOptions(method="every-token", sharpen="heur").sharpen == "heur"
    assert EngineOptions(method="gac-threshold", fusion="unite").fusion == "unite"
    assert EngineOptions(method="safe", sharpen=None).sharpen is None


def test_cli_leaves_fusion_and_sharpening_to_the_method_unless_given() -> None:
    from shared_engine.cli import build_parser
    from shared_engine.engine_args import engine_from_args

    def options(*flags: str):  # noqa: ANN202 - engines built from names load nothing until used
        args = build_parser().parse_args(["run", "--models", "a,b", *flags, "hi"])
        return engine_from_args(args, args.method or "safe").options

    assert (options("--method", "gac-threshold").fusion, options("--method", "gac-threshold").sharpen) == ("gac", None)
    assert options("--method", "every-token").sharpen is None
    assert options().sharpen == "heur"
    assert options("--method", "every-token", "--sharpen", "geom").sharpen == "geom"
    assert options("--sharpen", "none").sharpen is None
    assert options("--plausibility", "0.1").plausibility == 0.1
    assert options("--plausibility", "none").plausibility is None


def test_plausibility_keeps_a_sure_verifier_from_writing_a_token_the_drafter_rules_out() -> None:
    """FLORES en-ro, "Edgar Veguilla" (Qwen drafts with 2/3 of the weight, Gemma verifies): Qwen spreads
    its mass over Romanian words, Gemma is sure of '.', which Qwen gives nothing; the weighted mean and
    sharpening choose '.' and the answer became "Edgar Veguilla a. r. a. w. d. r. s. r. r. r. ...". Under
    the constraint Gemma reranks only what Qwen finds plausible."""
    keys = [b".", b" fost", b" primit", b" suferit", b" ob"]
    fused, w = _fused(keys, [[0.001, 0.30, 0.28, 0.26, 0.159], [0.8, 0.0, 0.0, 0.1, 0.1]], [2 / 3, 1 / 3])
    scores, _ = sharpen(fused, w, "heur", drafter_top={b" fost", b" primit", b" suferit", b" ob"})
    assert keys[int(torch.argmax(scores))] == b"."
    mask = plausible(fused, 0.1)
    assert mask.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    # the verifier still reranks within the plausible set: " suferit" (0.26 and 0.1) beats " fost" (0.30 and 0)
    assert keys[int(torch.argmax(scores * mask))] == b" suferit"
    # alpha = 1 leaves only the drafter's own best; the drafter's best always stays
    assert plausible(fused, 1.0).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_without_specials_rules_out_the_non_eos_specials_of_the_table_as_it_is_now() -> None:
    """The index of a table's specials is built once (Gemma-3's 6,247 took 2.6 ms per drafted token),
    and built again when the table's special or EOS ids are replaced."""
    from shared_engine.fusion import without_specials

    table = TokenTable(byte_level_tokenizer(), vocab_size=300)
    logits = torch.zeros(300)
    ruled_out = {i for i in table.special_ids - table.eos_ids if i < 300}
    assert ruled_out, "the toy tokenizer has a non-EOS special"
    first = without_specials(logits, table)
    assert {int(i) for i in torch.nonzero(torch.isinf(first))} == ruled_out and not torch.isinf(logits).any()
    table.eos_ids = table.eos_ids | ruled_out  # now every special ends the answer: none is ruled out
    assert not torch.isinf(without_specials(logits, table)).any()
    assert torch.isinf(without_specials(torch.zeros(2, 300), table.__class__.from_bytes(
        table.pieces, special_ids={5}, eos_ids=set(), encode=lambda s: [], name="t"))[:, 5]).all()


def test_fusion_never_commits_part_of_a_character_the_drafter_did_not_write() -> None:
    """A candidate holding only a character's first byte (a byte-level piece, "\\xe7") won the fusion, the
    drafter did not complete the character, and a U+FFFD stayed in the answer (Qwen + SmolLM2 sampling a
    Chinese answer: '北京是一个中国\\ufffd行业中心的城市'). The drafter's own split token still stands."""
    from shared_engine.decoding.round import FusionSettings, _fuse
    from shared_engine.fusion import MemberDist, make_fuser
    from shared_engine.sampling import Sampler

    bpe, sp = toy_member("toy-bpe", "byte_level").table, toy_member("toy-sp", "metaspace", seed=1).table

    def logits(table: TokenTable, favour: dict[bytes, float]) -> torch.Tensor:
        row = torch.full((table.vocab_size,), -20.0)
        for piece, value in favour.items():
            row[table.token_id(piece)] = value
        return row

    favour = {b"\xe7": 9.0, b" and": 6.0}
    dists = [MemberDist("bpe", bpe, logits(bpe, favour)), MemberDist("sp", sp, logits(sp, {b" and": 6.0}))]
    settings, weights = FusionSettings(make_fuser("unite", 10), None), torch.tensor([0.8, 0.2])  # the byte wins
    chosen = _fuse(dists, weights, settings, Sampler(), 0, bpe.token_id(b" and"), 0).chosen
    assert chosen == b" and"
    for seed in range(5):
        assert _fuse(dists, weights, settings, Sampler(1.0, seed=seed), 0, bpe.token_id(b" and"), 0).chosen == b" and"
    own = _fuse(dists[:1], torch.tensor([1.0]), settings, Sampler(), 0, bpe.token_id(b"\xe7"), 0).chosen
    assert own == b"\xe7"  # the drafter's own first byte, the fused best: it writes the rest itself
