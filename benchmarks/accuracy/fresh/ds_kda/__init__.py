"""Kimi Delta Attention inference in the shape of DeepSpeed's inference engines.

``init_inference`` builds the v1 engine (module injection, ``dtype=torch.half``);
``create_ragged_engine`` builds the FastGen-style v2 engine whose state manager hands out
ReplaySSM slots to sequences.
"""

__version__ = "0.4.2"
