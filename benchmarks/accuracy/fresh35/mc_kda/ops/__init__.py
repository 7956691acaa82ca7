"""Kernels and the layers that call them."""
