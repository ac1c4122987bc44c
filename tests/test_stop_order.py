"""Two stop strings completed by the same token cut at the earlier one whatever their order (it cut
at the first in list order, then searched the next only in the cut text: ' of' kept part of ' offi')."""
from shared_engine import EnsembleEngine
from tests.toy import toy_member


def test_stop_order_does_not_change_the_cut() -> None:
    members = [toy_member("so-a", "byte_level", "llama", 1), toy_member("so-b", "metaspace", "gpt2", 2)]
    eng = EnsembleEngine(members, method="safe", max_new_tokens=40)
    one = eng.generate("x = 3", temperature=0.9, seed=3, stop=["fice", " offi"]).text
    other = eng.generate("x = 3", temperature=0.9, seed=3, stop=[" offi", "fice"]).text
    assert one == other == eng.generate("x = 3", temperature=0.9, seed=3, stop=[" offi"]).text
