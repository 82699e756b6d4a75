"""Environments trajectories run in: deterministic tool / web / text environments and the LLM-simulated one."""

from envs.base import Environment, Snapshot, StepResult, Task
from envs.registry import available_envs, make_env, register_env

__all__ = ["Environment", "Snapshot", "StepResult", "Task", "available_envs", "make_env", "register_env"]
