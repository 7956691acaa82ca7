"""Kimi Delta Attention decoders with ReplaySSM incremental decoding, in the fairseq2 layout."""
