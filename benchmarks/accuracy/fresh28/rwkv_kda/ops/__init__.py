"""Kernels: the ReplaySSM KDA decode (a CPU stand-in here) and the ring cache modules."""

from .kda import CALLS, fused_recurrent_kda_replayssm_decode, kda_gate, kda_readout, l2norm, last_call, replay
__all__ = ["CALLS", "fused_recurrent_kda_replayssm_decode", "kda_gate", "kda_readout", "l2norm", "last_call", "replay"]
