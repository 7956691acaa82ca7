"""megatron.core-style building blocks for KDA (Kimi Linear) models."""
