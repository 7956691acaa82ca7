"""Kimi-Linear (KDA) generation in the layout of torchtune: modules, model builders, training
utilities and a generation recipe."""
