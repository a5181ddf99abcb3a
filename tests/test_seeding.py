import pytest

from offline_agent.seeding import stable_seed


def test_golden_values_do_not_change():
    # Pinned: changing the scheme silently changes every sampled run and resumed search.
    assert stable_seed(0) == stable_seed("0")
    assert stable_seed(0, "task-1", 3, "rollout/2") == 6941484925042207785
    assert stable_seed() == 724655455495936113


def test_parts_are_distinguished_and_in_range():
    seeds = {stable_seed(s, r) for s in range(20) for r in range(20)}
    assert len(seeds) == 400
    assert all(0 <= s < 2**63 for s in seeds)
    assert stable_seed(1, 23) != stable_seed(12, 3)


def test_rejects_other_types():
    with pytest.raises(TypeError):
        stable_seed(1.5)
    with pytest.raises(TypeError):
        stable_seed(True)
