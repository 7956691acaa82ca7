"""A slice of vLLM V1 with Kimi Linear (KDA) support through ReplaySSM decode.

Only the parts the KDA decode path touches are here: configs, the KV cache specs and their
allocation in the model runner, the KDA layer and its torch fallback kernel, the MTP drafter,
CPU offloading and the shared-storage KV connector.
"""

__version__ = "0.10.2.dev0+kda"
