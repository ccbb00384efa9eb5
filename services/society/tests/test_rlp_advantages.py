"""RLP advantages: the paper's group advantage, running reward normalisation, GAE."""

from __future__ import annotations

import math
import statistics

import pytest

from flywheel.society.rlp import RewardNormalizer, gae, group_advantages


def test_group_advantage_is_leave_one_out() -> None:
    rewards = [1.0, 2.0, 6.0]
    got = group_advantages(rewards)
    assert got == pytest.approx([1.5 * (1 - 3), 1.5 * (2 - 3), 1.5 * (6 - 3)])
    # G/(G-1)(r_i - mean) == r_i - mean of the others
    for i, r in enumerate(rewards):
        others = [x for j, x in enumerate(rewards) if j != i]
        assert got[i] == pytest.approx(r - sum(others) / len(others))
    assert sum(got) == pytest.approx(0.0)
    assert group_advantages([0.5, 0.5]) == [0.0, 0.0]


@pytest.mark.parametrize("bad", [[], [1.0], [1.0, math.nan], [math.inf, 0.0]])
def test_group_advantage_refuses_meaningless_groups(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(bad)


def test_normalizer_matches_statistics_and_round_trips() -> None:
    norm = RewardNormalizer()
    assert norm.normalize(3.0) == 3.0  # nothing seen yet
    data = [0.3, -1.2, 2.5, 0.0, 4.1]
    norm.update(data[:2])
    norm.update(data[2:])
    assert norm.mean == pytest.approx(statistics.mean(data))
    assert norm.std == pytest.approx(statistics.stdev(data))
    assert norm.normalize(2.5) == pytest.approx((2.5 - statistics.mean(data)) / statistics.stdev(data))
    again = RewardNormalizer.from_dict(norm.to_dict())
    assert again.normalize(1.0) == pytest.approx(norm.normalize(1.0))
    with pytest.raises(ValueError, match="finite"):
        norm.update([math.nan])


def test_gae_against_a_hand_computation() -> None:
    rewards, values = [1.0, 0.0, 2.0], [0.5, 0.4, 0.3]
    gamma, lam, last = 0.99, 0.95, 0.2
    d2 = 2.0 + gamma * last - 0.3
    d1 = 0.0 + gamma * 0.3 - 0.4
    d0 = 1.0 + gamma * 0.4 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    adv, ret = gae(rewards, values, gamma=gamma, gae_lambda=lam, last_value=last)
    assert adv == pytest.approx([a0, a1, a2])
    assert ret == pytest.approx([a0 + 0.5, a1 + 0.4, a2 + 0.3])
    done, _ = gae(rewards, values, last_value=last, done=True)
    assert done[2] == pytest.approx(2.0 - 0.3)  # no bootstrap past a finished run


def test_gae_with_lambda_one_and_zero_values_is_the_discounted_return() -> None:
    rewards = [1.0, 2.0, 3.0]
    adv, _ = gae(rewards, [0.0] * 3, gamma=0.9, gae_lambda=1.0)
    assert adv == pytest.approx([1 + 0.9 * 2 + 0.81 * 3, 2 + 0.9 * 3, 3.0])
    with pytest.raises(ValueError, match="values"):
        gae([1.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="gamma"):
        gae([1.0], [0.0], gamma=1.5)
