"""A text-generation web UI backend for Kimi Linear (KDA) models with ReplaySSM ring caches.

The layout follows the web UI: ``modules/`` holds the process-wide state (``shared``), the model
loaders, the backends and the generation code; ``extensions/`` holds optional scripts that hook
into them.
"""

__version__ = "0.4.2"
