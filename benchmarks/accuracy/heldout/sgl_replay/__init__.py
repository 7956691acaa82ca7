"""Kimi-Linear serving in sglang's layout: environment policy, state params, pool, backend."""
