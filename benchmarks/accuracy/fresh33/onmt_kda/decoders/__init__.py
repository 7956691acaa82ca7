"""Module defining decoders."""

from onmt_kda.decoders.kda_decoder import KDADecoder

str2dec = {"kda": KDADecoder}

__all__ = ["KDADecoder", "str2dec"]
