"""Kimi Delta Attention actors, rollout engines and PPO experience utilities with ReplaySSM decode
caches, written after OpenRLHF's layout (CPU reference implementation)."""

__version__ = "0.1.0"
