"""mistral-inference for hybrid models with Kimi Delta Attention layers."""
