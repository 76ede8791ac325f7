"""The sampler (chapter 11) and SamplingParams (chapter 10): filters, seeds, distributions."""

import pytest
import torch

from minipaged.engine.sampler import make_generator, sample
from minipaged.engine.scheduler import SamplingParams


def test_sampling_params_validate():
    for bad in (dict(n=0), dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5),
                dict(max_tokens=0), dict(top_k=1.5)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


def test_greedy_and_degenerate_filters_pick_the_argmax():
    torch.manual_seed(0)
    logits = torch.randn(5, 300)
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(top_p=1e-9),
              SamplingParams(temperature=1e-4), SamplingParams(temperature=0, top_k=5)]
    assert torch.equal(sample(logits, params), logits.argmax(-1))


def test_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(1)
    row = torch.randn(1, 1000)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    alone = sample(row, [params], [make_generator(42, row.device)])
    others = torch.randn(7, 1000)
    mixed = sample(torch.cat([others[:3], row, others[3:]]), [SamplingParams()] * 3 + [params] + [SamplingParams()] * 4,
                   [None] * 3 + [make_generator(42, row.device)] + [None] * 4)
    assert mixed[3] == alone[0]
    streams = [sample(row, [params], [make_generator(42, row.device)]).item() for _ in range(3)]
    assert len(set(streams)) == 1


def _frequencies(logits, params, n=40_000):
    tokens = sample(logits.repeat(n, 1), [params] * n)
    return torch.bincount(tokens, minlength=logits.shape[-1]).float() / n


def test_temperature_sampling_follows_softmax():
    torch.manual_seed(2)
    logits = torch.tensor([[0.5, 1.5, -1.0, 2.0, 0.0]])
    for temperature in (1.0, 0.5, 2.0):
        freq = _frequencies(logits, SamplingParams(temperature=temperature))
        expected = (logits[0] / temperature).softmax(-1)
        assert (freq - expected).abs().max() < 0.015, (temperature, freq, expected)


def test_top_k_and_top_p_restrict_the_support_and_renormalize():
    torch.manual_seed(3)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]])
    probs = logits[0].softmax(-1)
    freq = _frequencies(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(freq.nonzero().flatten().tolist()) == {0, 4}
    expected = torch.zeros(5)
    expected[[0, 4]] = probs[[0, 4]] / probs[[0, 4]].sum()
    assert (freq - expected).abs().max() < 0.015
    # nucleus: 4 (0.64) then 0 (0.24) reach 0.88 >= 0.8, so exactly those two remain
    freq = _frequencies(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert set(freq.nonzero().flatten().tolist()) == {0, 4}
    freq = _frequencies(logits, SamplingParams(temperature=1.0, top_p=0.95))
    assert set(freq.nonzero().flatten().tolist()) == {0, 1, 4}


def test_rows_with_different_params_in_one_batch():
    torch.manual_seed(4)
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=0), SamplingParams(top_k=3), SamplingParams(top_p=0.5),
              SamplingParams(temperature=0.8)]
    for _ in range(50):
        tokens = sample(logits, params)
        assert tokens[0] == logits[0].argmax()
        assert tokens[1] in logits[1].topk(3).indices
        assert logits.shape[1] > tokens[3] >= 0
    with pytest.raises(ValueError):
        sample(logits, params[:3])
