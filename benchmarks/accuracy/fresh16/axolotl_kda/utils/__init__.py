"""Config, model-loading and callback helpers."""
