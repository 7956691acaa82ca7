"""Weights of the Kimi-Linear layers (lightllm/common/basemodel/layer_weights/*)."""

import os

import torch

from .utils import init_logger

logger = init_logger(__name__)


class BaseLayerWeight:
    def __init__(self, data_type, network_config, mode):
        self.data_type_ = data_type
        self.network_config_ = network_config
        self.mode = mode
        self.weight_names = {}
        self.loaded = set()

    def _create(self, shapes, fp32_names=()):
        # created under the model's default dtype; the decay parameters stay in fp32
        for attr, shape in shapes.items():
            dtype = torch.float32 if attr in fp32_names else None
            setattr(self, attr, torch.empty(shape, dtype=dtype))

    def load_hf_weights(self, weights):
        for attr, name in self.weight_names.items():
            if name in weights:
                getattr(self, attr).copy_(weights[name])
                self.loaded.add(attr)

    def verify_load(self):
        missing = sorted(set(self.weight_names) - self.loaded)
        assert not missing, f"weights load not ok: {missing}"


class KimiLinearPreAndPostLayerWeight(BaseLayerWeight):
    def __init__(self, data_type, network_config, mode):
        super().__init__(data_type, network_config, mode)
        vocab, hidden = network_config["vocab_size"], network_config["hidden_size"]
        self.weight_names = {
            "wte_weight_": "model.embed_tokens.weight",
            "final_norm_weight_": "model.norm.weight",
            "lm_head_weight_": "lm_head.weight",
        }
        shapes = [(vocab, hidden), (hidden,), (vocab, hidden)]
        self._create(dict(zip(self.weight_names, shapes, strict=True)))


class KimiLinearTransformerLayerWeight(BaseLayerWeight):
    def __init__(self, layer_num, data_type, network_config, mode):
        super().__init__(data_type, network_config, mode)
        self.layer_num_ = layer_num
        linear = network_config["linear_attn_config"]
        hidden, d = network_config["hidden_size"], linear["head_dim"]
        hv, h = linear["num_heads"], linear["num_k_heads"]
        attn = f"model.layers.{layer_num}.self_attn"
        self.weight_names = {
            "att_norm_weight_": f"model.layers.{layer_num}.input_layernorm.weight",
            "qkv_proj_weight_": f"{attn}.qkv_proj.weight",
            "f_a_proj_weight_": f"{attn}.f_a_proj.weight",
            "f_b_proj_weight_": f"{attn}.f_b_proj.weight",
            "b_proj_weight_": f"{attn}.b_proj.weight",
            "o_proj_weight_": f"{attn}.o_proj.weight",
            "A_log_": f"{attn}.A_log",
            "dt_bias_": f"{attn}.dt_bias",
        }
        shapes = [(hidden,), (2 * h * d + hv * d, hidden), (d, hidden), (hv * d, d)]
        shapes += [(hv, hidden), (hidden, hv * d), (hv,), (hv, d)]
        self._create(dict(zip(self.weight_names, shapes, strict=True)), ("A_log_", "dt_bias_"))


def load_hf_weights(
    data_type, weight_dir, pre_post_layer=None, transformer_layer_list=None, weight_dict=None
):
    if weight_dict is None:
        weight_dict = {}
        for file_ in sorted(f for f in os.listdir(weight_dir) if f.endswith(".bin")):
            path = os.path.join(weight_dir, file_)
            weight_dict.update(torch.load(path, map_location="cpu", weights_only=True))
    if pre_post_layer is not None:
        pre_post_layer.load_hf_weights(weight_dict)
    for layer in transformer_layer_list or []:
        layer.load_hf_weights(weight_dict)
    logger.info(f"loaded {len(weight_dict)} tensors as {data_type}")


def random_hf_weights(network_config, std=0.05):
    """A checkpoint of random weights under HuggingFace names (tests, CPU smoke runs)."""
    layers = [KimiLinearPreAndPostLayerWeight(torch.float32, network_config, [])]
    for i in range(network_config["num_hidden_layers"]):
        layers.append(KimiLinearTransformerLayerWeight(i, torch.float32, network_config, []))
    return {
        name: torch.randn(getattr(layer, attr).shape) * std
        for layer in layers
        for attr, name in layer.weight_names.items()
    }
