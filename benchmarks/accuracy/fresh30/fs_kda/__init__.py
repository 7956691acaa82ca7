"""fs_kda: Kimi Delta Attention language models on a fairseq-style code base.

The package follows fairseq's layout: ``models/`` registers model classes and named
architectures, ``modules/`` holds the layers (``KimiDeltaAttention`` keeps its decode state in
fairseq ``incremental_state`` dicts), ``sequence_generator`` runs beam search,
``checkpoint_utils`` and ``hub_utils`` load trained checkpoints, and ``cli/`` has the
``generate``, ``interactive`` and ``serve`` entry points.
"""

__version__ = "0.4.0"
