"""petals_kda: KDA (Kimi Delta Attention) blocks served over a Petals swarm."""

__version__ = "0.3.1"
