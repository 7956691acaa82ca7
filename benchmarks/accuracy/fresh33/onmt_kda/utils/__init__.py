"""Module defining various utilities."""

from onmt_kda.utils.misc import set_random_seed, tile, use_gpu

__all__ = ["set_random_seed", "tile", "use_gpu"]
