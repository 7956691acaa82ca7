from nanochat_kda.kernels.replay import LAST_CALL, ReplayDecode, alloc_rings, kda_replayssm_decode # noqa: F401
