"""Aphrodite-style serving engine for hybrid Kimi Linear (KDA) models, with ReplaySSM decode.

``common`` (configs, dtype tables), ``engine`` (EngineArgs and the engine loop), ``ops`` (the
ReplaySSM reference kernel), ``modeling`` (layers, quantization, model loader, models, sampler),
``task_handler`` (worker, model runner, cache engine), ``processing`` (preemption snapshots) and
``serve`` (Ray-Serve-style deployments and the OpenAI-compatible handler).
"""

__version__ = "0.6.2.post1"
