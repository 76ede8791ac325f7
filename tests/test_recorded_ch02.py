"""Chapter 2: claims the prose and the solutions make about simulated runs."""

import minipaged.fragmentation as frag
from minipaged.fragmentation import POLICIES, generate_workload, simulate
from solutions.ch02_fragmentation import BestFitAllocator  # exercise 2.4's reference answer


def test_best_fit_only_shaves_the_oracles_external_fragmentation(monkeypatch):
    requests = generate_workload("sharegpt", 600, seed=0)
    first = simulate(requests, "oracle", 16384).shares()["external"]
    monkeypatch.setattr(frag, "FirstFitAllocator", BestFitAllocator)
    best = simulate(requests, "oracle", 16384).shares()["external"]
    assert 0 < first - best < 0.04 and best > 0.1      # "a point or two, no more"


def test_the_oracles_free_memory_is_mostly_real_fragmentation():
    requests = generate_workload("sharegpt", 600, seed=0)
    runs = {p: simulate(requests, p, 16384).shares() for p in POLICIES}
    assert runs["oracle"]["external"] > 10 * runs["oracle"]["blocked"]
    assert runs["paged"]["external"] == 0 and runs["max"]["external"] == 0
    assert runs["paged"]["headroom"] + runs["paged"]["blocked"] < 0.03
