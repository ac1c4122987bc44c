"""A temperature below float32's tiny (1e-300) is greedy; it raised a torch RuntimeError (0/0 NaN)."""
import torch

from shared_engine.sampling import Sampler


def test_tiny_temperature_is_greedy() -> None:
    sampler = Sampler(temperature=1e-300, seed=0)
    probs = sampler._softmax(torch.tensor([0.5, 2.0, -1.0]))
    assert not torch.isnan(probs).any() and int(torch.argmax(probs)) == 1


def test_a_tiny_adafuse_candidate_temperature_is_greedy() -> None:
    """AdaFuse's candidates use the Sampler's softmax: 2e-38 (above tiny) overflowed logits / T to inf
    and multinomial raised on the NaN; it and 1e-300 now write the greedy candidates."""
    from shared_engine import EnsembleEngine
    from tests.toy import toy_member

    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]

    def answer(temperature: float) -> str:
        engine = EnsembleEngine(members, method="adafuse", threshold=1.0, candidate_temperature=temperature)
        return engine.generate("Tom wrote", max_new_tokens=12).text

    greedy = answer(0.0)
    assert answer(2e-38) == greedy and answer(1e-300) == greedy
