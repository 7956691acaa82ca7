"""Settings of a run and where they come from: ``[tool.replaylint]`` or ``replaylint.toml``."""
