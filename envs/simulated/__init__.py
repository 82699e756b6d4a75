"""An environment played by an LLM from tool specs, a policy and seed trajectories (Simia-RL / UI-Simulator)."""

from envs.simulated.env import SimulatedEnv, SimulationError

__all__ = ["SimulatedEnv", "SimulationError"]
