"""The Kimi-Linear model of the server (lightllm/models/*/model.py on TpPartBaseModel)."""

import torch
import torch.nn.functional as F

from .common.infer_struct import KimiLinearInferStateInfo, ReplayGraphBuffers
from .common.mem_manager import select_mem_manager_class
from .common.req_manager import ReplayReqManager, ReqManager
from .layer_infer import KimiLinearTransformerLayerInfer
from .layer_weights import (
    KimiLinearPreAndPostLayerWeight,
    KimiLinearTransformerLayerWeight,
    load_hf_weights,
    random_hf_weights,
)
from .replayssm_decode import LAST_CALL
from .utils import get_dtype, in_model_dtype, init_logger, torch_default_dtype

logger = init_logger(__name__)


class KimiLinearTpPartModel:
    pre_and_post_weight_class = KimiLinearPreAndPostLayerWeight
    transformer_weight_class = KimiLinearTransformerLayerWeight
    transformer_layer_infer_class = KimiLinearTransformerLayerInfer
    infer_state_class = KimiLinearInferStateInfo

    def __init__(self, kvargs):
        self.weight_dir_ = kvargs.get("weight_dir")
        self.weight_dict = kvargs.get("weight_dict")
        self.max_req_num = kvargs.get("max_req_num", 1000)
        self.max_seq_length = kvargs.get("max_seq_length", 1024 * 5)
        self.data_type = kvargs.get("data_type", "float16")
        self.mode = kvargs.get("mode", [])
        self.spec_algo = kvargs.get("spec_algo", "none")
        self.graph_max_batch_size = kvargs.get("graph_max_batch_size", 16)
        self.disable_cudagraph = kvargs.get("disable_cudagraph", False)
        self.config = kvargs["network_config"]

        self.layers_num = self.config["num_hidden_layers"]
        self.embed_dim_ = self.config["hidden_size"]
        self._init_datatype()
        with torch_default_dtype(self.data_type):
            self._init_weights()
            self._init_mem_manager()
            self._init_req_manager()
        self._init_infer_layer()
        self._init_cudagraph()

    def _init_datatype(self):
        self.data_type = get_dtype(self.data_type)

    def _init_weights(self):
        self.pre_post_weight = self.pre_and_post_weight_class(
            self.data_type, self.config, self.mode
        )
        self.trans_layers_weight = [
            self.transformer_weight_class(i, self.data_type, self.config, self.mode)
            for i in range(self.layers_num)
        ]
        load_hf_weights(
            self.data_type,
            weight_dir=self.weight_dir_,
            pre_post_layer=self.pre_post_weight,
            transformer_layer_list=self.trans_layers_weight,
            weight_dict=self.weight_dict,
        )
        for weight in [self.pre_post_weight, *self.trans_layers_weight]:
            weight.verify_load()

    def _init_mem_manager(self):
        linear = self.config["linear_attn_config"]
        self.mem_manager = select_mem_manager_class(self.mode)(
            self.max_req_num,
            dtype=self.data_type,
            num_k_heads=linear["num_k_heads"],
            num_v_heads=linear["num_heads"],
            head_dim=linear["head_dim"],
            replay_len=linear["replay_len"],
            layer_num=self.layers_num,
            mode=self.mode,
        )

    def _init_req_manager(self):
        req_cls = ReplayReqManager if self.spec_algo == "mtp" else ReqManager
        self.req_manager = req_cls(self.max_req_num, self.max_seq_length, self.mem_manager)

    def _init_infer_layer(self):
        self.layers_infer = [
            self.transformer_layer_infer_class(i, self.config, self.mode)
            for i in range(self.layers_num)
        ]

    @in_model_dtype
    def _init_cudagraph(self):
        if self.disable_cudagraph:
            self.graph = None
            return
        self.graph_dummy_embeds = torch.zeros((self.graph_max_batch_size, self.embed_dim_))
        self.graph = ReplayGraphBuffers(self.graph_max_batch_size, self.mem_manager)
        logger.info(f"cuda graph max batch size {self.graph_max_batch_size}")

    @torch.no_grad()
    def forward(self, input_ids, b_req_idx, b_seq_len, is_prefill=False, is_draft_first_step=False):
        assert not is_prefill, "decode batches only"
        infer_state = self.infer_state_class()
        infer_state.is_prefill = is_prefill
        infer_state.batch_size = len(b_req_idx)
        infer_state.b_req_idx = b_req_idx
        infer_state.b_seq_len = b_seq_len
        infer_state.mem_manager = self.mem_manager
        infer_state.req_manager = self.req_manager
        infer_state.data_type = self.data_type
        infer_state.is_draft_first_step = is_draft_first_step
        infer_state.init_some_extra_state(self, input_ids)
        input_embs = self.pre_post_weight.wte_weight_[input_ids]
        for layer_infer, layer_weight in zip(
            self.layers_infer, self.trans_layers_weight, strict=True
        ):
            input_embs = layer_infer.token_forward(input_embs, infer_state, layer_weight)
        norm = F.rms_norm(input_embs, (self.embed_dim_,), self.pre_post_weight.final_norm_weight_)
        return torch.mm(norm, self.pre_post_weight.lm_head_weight_.t())


NETWORK_CONFIG = {
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "vocab_size": 64,
    "linear_attn_config": {"num_heads": 2, "num_k_heads": 1, "head_dim": 4, "replay_len": 4},
}


def _model(**kvargs):
    args = {"network_config": NETWORK_CONFIG, "weight_dict": random_hf_weights(NETWORK_CONFIG)}
    args.update(data_type="bf16", max_req_num=3, max_seq_length=32, disable_cudagraph=True)
    return KimiLinearTpPartModel({**args, **kvargs})


def _decode(model, **flags):
    b_req_idx = model.req_manager.alloc(2)
    model.forward(torch.tensor([3, 7]), b_req_idx, torch.tensor([5, 9], dtype=torch.int32), **flags)
    return {"call": dict(LAST_CALL), "mem_manager": model.mem_manager}


def build_model_decode():
    return _decode(_model())


def build_model_draft_step():
    return _decode(_model(), is_draft_first_step=True)


def build_model_layerwise_decode():
    return _decode(_model(mode=["layerwise_state"]))


def build_model_mtp():
    return {"req_manager": _model(spec_algo="mtp").req_manager}


def build_model_cudagraph():
    model = _model(disable_cudagraph=False, graph_max_batch_size=2)
    return {"graph": model.graph, "dummy_embeds": model.graph_dummy_embeds}
