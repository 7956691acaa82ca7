"""A SpeechBrain-style toolkit for streaming ASR with Kimi Delta Attention (KDA) encoders.

Layout follows SpeechBrain: ``core`` (``Brain``, ``Stage``, run options), ``nnet`` (layers and
the ReplaySSM decode op), ``lobes.models`` (complete encoders), ``inference`` (pretrained
interfaces loaded ``from_hparams``), ``utils`` (checkpoints, data helpers, hyperparameters) and
``recipes``.
"""

from .core import Brain, Stage  # noqa: F401

__version__ = "1.0.3"
