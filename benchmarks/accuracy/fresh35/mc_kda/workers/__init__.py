"""Prefill and decode workers of a disaggregated deployment."""
