"""Generation methods that produce new trajectories (simulated environments, replay, self-challenging tasks, search)."""
