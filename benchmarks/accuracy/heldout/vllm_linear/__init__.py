"""Hybrid KDA model executor pieces in vLLM's style: cache specs, a layer, offload, loading."""
