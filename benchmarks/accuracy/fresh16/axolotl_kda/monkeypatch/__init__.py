"""Patches applied to the Kimi Linear model classes at load time."""
