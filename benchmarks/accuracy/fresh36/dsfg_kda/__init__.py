"""Ragged (FastGen-style) inference for hybrid Kimi Delta Attention models.

Layout follows DeepSpeed inference v2 and MII:

* ``config_v2``: engine, state-manager and SSM cache configs, dtype enums;
* ``ragged``: sequence tracking (``DSStateManager``), ragged batches and the blocked SSM cache
  that holds each sequence's ReplaySSM checkpoint and rings;
* ``kernels`` / ``modules``: the ReplaySSM decode kernel (reference) and the KDA attention module;
* ``model_implementations``: layer containers, the Kimi Linear model and its policy;
* ``checkpoint``: weight engines and the SSM state snapshot engine;
* ``engine_v2`` / ``engine_factory``: ``InferenceEngineV2`` and ``create_kda_engine``;
* ``mii``: ``ModelConfig`` and the ``pipeline`` entry point.
"""

__version__ = "0.4.0"
