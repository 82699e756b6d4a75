"""The arithmetic of an evaluation: pass@k, pass^k, and a paired bootstrap interval of a difference.

With n samples of a task of which c succeed:

- pass@k = 1 - C(n-c, k) / C(n, k): the chance that at least one of k samples drawn from the n
  succeeds (the unbiased estimator of Chen et al., 2021; `vf-eval`, inspect-ai);
- pass^k = C(c, k) / C(n, k): the chance that all k succeed (tau2-bench's reliability measure);

both averaged over tasks. pass@1 = pass^1 = c / n. A task with fewer than k scored samples has
no pass@k and is left out of that average (the count says how many tasks it is over).

Comparing two runs of the same tasks: the per-task difference of pass@1 (b - a), its mean, and a
paired bootstrap interval: tasks resampled with replacement, the mean difference taken each time,
the interval between its quantiles. Pairing by task removes the variance between tasks, which
dominates on benchmarks where tasks differ in difficulty.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from math import comb
from typing import Sequence

BOOTSTRAP_REPS = 10_000
LEVEL = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k of the n samples succeeds (c of them do)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance that all k of the n samples succeed (tau2's pass^k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass^k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    return comb(c, k) / comb(n, k)


@dataclass
class TaskScore:
    """The scored samples of one task: how many, how many succeeded, their rewards."""

    task: str
    samples: int = 0
    successes: int = 0
    rewards: list[float] = field(default_factory=list)

    def add(self, success: bool, reward: float) -> None:
        self.samples += 1
        self.successes += int(success)
        self.rewards.append(reward)

    @property
    def pass1(self) -> float | None:
        return self.successes / self.samples if self.samples else None


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pass_rates(scores: Sequence[TaskScore], max_k: int) -> dict[str, dict[str, float | int | None]]:
    """pass@k and pass^k for k = 1..max_k, each the mean over the tasks with at least k scored samples."""
    out: dict[str, dict[str, float | int | None]] = {}
    for k in range(1, max_k + 1):
        eligible = [s for s in scores if s.samples >= k]
        out[str(k)] = {"pass@k": mean([pass_at_k(s.samples, s.successes, k) for s in eligible]),
                       "pass^k": mean([pass_hat_k(s.samples, s.successes, k) for s in eligible]),
                       "tasks": len(eligible)}
    return out


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    level: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "level": self.level, "tasks": self.n}


def paired_bootstrap(differences: Sequence[float], *, reps: int = BOOTSTRAP_REPS, level: float = LEVEL,
                     seed: int = 0) -> Interval:
    """The mean of per-task differences and its percentile bootstrap interval (tasks resampled, seeded)."""
    n = len(differences)
    if n == 0:
        raise ValueError("no task in common to compare")
    rng = random.Random(seed)
    values = list(differences)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(reps))
    tail = (1.0 - level) / 2
    low = means[int(tail * (reps - 1))]
    high = means[int(round((1.0 - tail) * (reps - 1)))]
    return Interval(sum(values) / n, low, high, level, n)
