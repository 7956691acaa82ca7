"""Kimi Delta Attention models with ReplaySSM decoding, laid out like torchtitan."""
