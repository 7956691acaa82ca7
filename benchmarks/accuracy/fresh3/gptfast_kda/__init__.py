"""gpt-fast for hybrid Kimi Delta Attention models: simple, fast, pure PyTorch generation."""
