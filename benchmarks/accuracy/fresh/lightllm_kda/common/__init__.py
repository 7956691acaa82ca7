"""Memory and request managers and the per-batch infer state."""
