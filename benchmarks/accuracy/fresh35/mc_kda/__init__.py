"""KV-state transfer for disaggregated prefill/decode serving of Kimi Linear (KDA) models.

Modelled on the Mooncake transfer engine and store as Dynamo's disaggregated workers use them:
a prefill worker runs the prompt on its cache slots, a connector moves the request's ReplaySSM
rings (checkpoint state, delta/key/log-decay rings, cursor) into a decode worker's registered
memory (or through the store), and the decode worker continues the request.

Layout: ``config`` (settings from a JSON file and the environment), ``ops`` (the decode kernel
and the KDA mixer), ``transfer`` (engine, slot metadata, connector), ``allocator`` (slots and
ring storage), ``store`` (the object store and host offload), ``workers`` and ``cli``.
"""

__version__ = "0.3.1"
