"""Kimi-Linear serving pieces in sglang's layout: cache params, the mamba pool, the KDA backend."""
