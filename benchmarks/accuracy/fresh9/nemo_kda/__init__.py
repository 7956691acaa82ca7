"""NeMo-style toolkit for the KDA hybrid decoder: configs, ``ModelPT`` archives, precision plugins and
the ``collections.llm`` model with its ReplaySSM inference path."""

__version__ = "2.1.0rc0"
