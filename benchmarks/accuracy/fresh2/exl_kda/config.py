import json
import os

import torch

# Strings found in config.json "torch_dtype"
_torch_dtypes = {"float16": torch.half, "half": torch.half, "bfloat16": torch.bfloat16, "float32": torch.float}


def read(input_dict, expected_type, keys, default = None):
    if isinstance(keys, str): keys = [keys]
    for key in keys:
        if key not in input_dict: continue
        x = input_dict[key]
        if expected_type is float and isinstance(x, int): x = float(x)
        if not isinstance(x, expected_type):
            raise TypeError(f" ## Value type mismatch for config key: {key}, expected {expected_type}")
        return x
    return default


class ExLlamaV2Config:

    model_dir: str | None
    torch_dtype: torch.dtype
    kda_ring_dtype: torch.dtype
    kda_state_dtype: torch.dtype

    def __init__(self, model_dir: str | None = None):
        """
        :param model_dir:
            If specified, initialize ExLlamaV2Config with values read from model config.
        """
        self.model_dir = model_dir
        self.max_seq_len = 2048
        self.max_batch_size = 1
        self.kda_cacheless = False
        if model_dir is not None:
            self.prepare()

    def prepare(self, no_tensors: bool = False):

        assert self.model_dir is not None, "No model_dir specified in ExLlamaV2Config"
        self.model_config = os.path.join(self.model_dir, "config.json")
        assert os.path.exists(self.model_config), "Can't find " + self.model_config
        with open(self.model_config, encoding = "utf8") as f:
            read_config = json.load(f)

        self.architecture = read(read_config, list, "architectures", ["KimiLinearForCausalLM"])[0]
        self.hidden_size = read(read_config, int, "hidden_size")
        self.num_hidden_layers = read(read_config, int, ["num_hidden_layers", "n_layers"])
        self.vocab_size = read(read_config, int, "vocab_size", 32000)
        self.max_seq_len = read(read_config, int, ["max_position_embeddings", "max_seq_len"], self.max_seq_len)
        self.torch_dtype = _torch_dtypes.get(read(read_config, str, "torch_dtype", "float16"), torch.half)

        # Linear attention block, layer indices are 1-based in config.json
        lac = read(read_config, dict, "linear_attn_config", {})
        self.kda_layer_idx = [i - 1 for i in read(lac, list, "kda_layers", [])]
        self.kda_num_heads = read(lac, int, "num_heads", 1)
        self.kda_num_v_heads = read(lac, int, ["num_v_heads", "num_heads"], self.kda_num_heads)
        self.kda_head_dim = read(lac, int, "head_dim", 128)
        self.kda_replay_len = read(lac, int, ["replay_len", "ring_len"], 64)
        self.kda_lower_bound = read(lac, float, "lower_bound", None)

        # Replay rings are kept at model precision unless the checkpoint asks for fp32 rings. The
        # recurrent checkpoint is always accumulated in fp32
        fp32_rings = read(lac, bool, "fp32_rings", False)
        self.kda_ring_dtype = torch.float if fp32_rings else self.torch_dtype  # expect-bug: imported-policy id=ring-dtype
        self.kda_state_dtype = torch.float


def write_tiny_config(model_dir, **overrides) -> str:
    """Writes config.json for a small KimiLinear checkpoint (tests, examples)"""
    lac = {"kda_layers": [1, 2], "num_heads": 2, "num_v_heads": 2, "head_dim": 8, "replay_len": 4}
    lac.update(overrides.pop("linear_attn_config", {}))
    cfg = {"architectures": ["KimiLinearForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 64,
           "max_position_embeddings": 256, "torch_dtype": "float16", "linear_attn_config": lac}
    cfg.update(overrides)
    os.makedirs(model_dir, exist_ok = True)
    with open(os.path.join(model_dir, "config.json"), "w", encoding = "utf8") as f:
        json.dump(cfg, f, indent = 2)
    return str(model_dir)
