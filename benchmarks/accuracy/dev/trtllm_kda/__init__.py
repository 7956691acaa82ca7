"""A KDA hybrid model on a PyTorch executor with a Mamba-style cache manager (TensorRT-LLM layout)."""
