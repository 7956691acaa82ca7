from .replayssm import chunk_kda_fwd, fused_recurrent_kda_replayssm_decode, kda_gate, replay_state
