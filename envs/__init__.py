"""Environments trajectories run in: deterministic tool / web / text environments and the LLM-simulated one."""
