"""The engine's model agent and its cache engine."""
