"""RWKV-style inference for Kimi Delta Attention (KDA) models with ReplaySSM ring states.

Mirrors the ``rwkv`` pip package: ``RWKV(model, strategy)`` with ``forward(tokens, state)``,
``PIPELINE`` for sampling, state tuning files, a converter and a small chat/server loop.
"""

__version__ = "0.8.3"
