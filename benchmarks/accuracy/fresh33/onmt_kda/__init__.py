"""OpenNMT-py style toolkit for decoder-only KDA (Kimi Delta Attention) language models.

Layout follows OpenNMT-py: ``opts`` (command-line options), ``model_builder``, ``decoders``,
``models`` (checkpoint saving), ``translate`` (translator, decode strategies, REST server),
``modules`` (the ReplaySSM decode op) and ``utils``.
"""

__version__ = "3.5.1"
