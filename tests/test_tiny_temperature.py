"""A temperature below float32's tiny (1e-300) is greedy; it raised a torch RuntimeError (0/0 NaN)."""
import torch

from shared_engine.sampling import Sampler


def test_tiny_temperature_is_greedy() -> None:
    sampler = Sampler(temperature=1e-300, seed=0)
    probs = sampler._softmax(torch.tensor([0.5, 2.0, -1.0]))
    assert not torch.isnan(probs).any() and int(torch.argmax(probs)) == 1
