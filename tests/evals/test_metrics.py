"""pass@k, pass^k and the paired bootstrap against their definitions, enumerated by brute force."""

from __future__ import annotations

from itertools import combinations

import pytest

from evals.metrics import TaskScore, paired_bootstrap, pass_at_k, pass_hat_k, pass_rates


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_and_pass_hat_k_are_the_chances_over_every_k_subset(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(combinations(outcomes, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
            assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_rates_average_over_tasks_with_enough_samples():
    scores = [TaskScore("a"), TaskScore("b"), TaskScore("c")]
    for ok in (True, True, True):
        scores[0].add(ok, 1.0)
    for ok in (True, False, False):
        scores[1].add(ok, float(ok))
    scores[2].add(True, 1.0)  # one sample only: in pass@1, not in pass@2 or pass@3
    rates = pass_rates(scores, 3)
    assert rates["1"]["pass@k"] == pytest.approx((1 + 1 / 3 + 1) / 3) == rates["1"]["pass^k"]
    assert rates["2"] == {"pass@k": pytest.approx((1 + 2 / 3) / 2), "pass^k": pytest.approx(0.5), "tasks": 2}
    assert rates["3"] == {"pass@k": pytest.approx(1.0), "pass^k": pytest.approx(0.5), "tasks": 2}
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_paired_bootstrap_is_seeded_and_brackets_the_mean():
    diffs = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    a, b = paired_bootstrap(diffs, seed=3), paired_bootstrap(diffs, seed=3)
    assert a == b and a.mean == pytest.approx(0.625)
    assert 0.0 <= a.low < a.mean < a.high <= 1.0
    same = paired_bootstrap([0.25] * 5)
    assert same.low == same.mean == same.high == 0.25  # no spread between tasks: no uncertainty left
    with pytest.raises(ValueError):
        paired_bootstrap([])
