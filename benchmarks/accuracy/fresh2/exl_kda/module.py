import zlib

import torch


class ExLlamaV2Module:

    model = None
    key: str
    device_idx: int

    def __init__(self, model, key: str):
        self.model = model
        self.key = key
        self.device_idx = -1
        self.config = model.config

    def device(self) -> str:
        return "cpu" if self.device_idx < 0 else f"cuda:{self.device_idx}"

    def load_weight(self, key: str, shape: tuple, dtype: torch.dtype = torch.half) -> torch.Tensor:
        # Without .safetensors shards in model_dir, tensors are synthesized deterministically from their key
        gen = torch.Generator().manual_seed(zlib.crc32(key.encode("utf8")))
        return (torch.randn(shape, generator = gen, dtype = torch.float) * 0.05).to(dtype = dtype, device = self.device())

    def load(self): pass

    def forward(self, hidden_states, cache = None, attn_params = None, past_len = None, **kwargs):
        raise NotImplementedError


class ExLlamaV2Embedding(ExLlamaV2Module):

    name: str = "Embedding"

    def load(self):
        self.embedding = self.load_weight(self.key + ".weight", (self.config.vocab_size, self.config.hidden_size))

    def forward(self, hidden_states, cache = None, attn_params = None, past_len = None, **kwargs):
        return self.embedding[hidden_states]


class ExLlamaV2RMSNorm(ExLlamaV2Module):

    name: str = "RMSNorm"

    def load(self):
        self.weight = self.load_weight(self.key + ".weight", (self.config.hidden_size,)) + 1.0

    def forward(self, hidden_states, cache = None, attn_params = None, past_len = None, **kwargs):
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim = True) + 1e-6)
        return x.to(hidden_states.dtype) * self.weight
