"""Core classes: configs and the ``ModelPT`` base."""
