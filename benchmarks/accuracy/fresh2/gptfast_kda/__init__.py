"""Kimi-Linear (KDA layers decoding with the ReplaySSM cache) in the style of gpt-fast: a
single-file model, a generate script with a compiled one-token decode, int8 weight-only
quantization and tensor parallelism, in plain PyTorch."""
