"""Kernel warm-up and ring metrics. ``model_warmup`` covers the request path only; the kernel is
compiled per ring layout and activation type, so instances also run these launches once."""

import contextlib

import torch

from . import triton_utils as pb_utils
from .export import make_model_config, state_dtype
from .kda_ops import DECODE_TRACE, KDAReplayLayer, PinnedDecayLayer, fused_recurrent_kda_replayssm_decode
from .state import RingGeometry, SequenceStatePool

@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)

def _launch(layer: KDAReplayLayer, **rings: torch.Tensor) -> dict[str, torch.Tensor]:
    """One launch of the op for slot 0 at position 0; ``rings`` are its state keyword arguments."""
    hidden, zero = torch.ones(1, 8, dtype=layer.qkv.weight.dtype), torch.zeros(1, dtype=torch.int32)
    out = hidden.new_zeros(1, layer.decay_log_ring.shape[1], layer.delta_ring.shape[-1])
    fused_recurrent_kda_replayssm_decode(layer.qkv(hidden), layer.a_proj(hidden), layer.b_proj(hidden), layer.A_log,
                                         layer.dt_bias, layer.scale, out=out, ssm_state_indices=zero, write_pos=zero, **rings)
    return dict(DECODE_TRACE)

def warm_kernel(geometry: RingGeometry, data_types=("TYPE_FP16", "TYPE_BF16")) -> list[dict[str, torch.Tensor]]:
    """Compiles the kernel for each activation type the instance may be given."""
    launches = []
    for act in (pb_utils.TYPE_TO_TORCH[data_type] for data_type in data_types):
        d, k, g = (torch.zeros(1, *dims, dtype=act) for dims in geometry.ring_dims().values())  # expect-bug: pool-dtype id=warm-rings
        state = torch.zeros(1, *geometry.state_dims(), dtype=torch.float32)
        launches.append(_launch(KDAReplayLayer(8, geometry, 1, act), initial_state=state, d_cache=d, k_cache=k, g_cache=g))
    return launches

def warm_instance(config: dict, geometry: RingGeometry) -> dict:
    """Launches on the state types an instance of ``config`` runs with, and its first implicit request."""
    act, dims = pb_utils.TYPE_TO_TORCH[pb_utils.get_model_param(config, "activation_type")], geometry.ring_dims()
    ssm = torch.zeros(1, *geometry.state_dims())
    with default_dtype(act):  # expect-bug: default-dtype id=warm-default
        layer = PinnedDecayLayer(8, geometry, slots=1)
        delta, key = torch.zeros(1, *dims["delta"]), torch.zeros(1, *dims["key"])
        decay = torch.zeros(1, *dims["decay_log"])  # expect-bug: default-dtype id=warm-default
    first = _launch(layer, initial_state=ssm, d_cache=delta, k_cache=key, g_cache=decay)
    dtype = state_dtype(config)
    request = {"STATE_DELTA_0": torch.zeros(1, *dims["delta"], dtype=dtype), "STATE_KEY_0": torch.zeros(1, *dims["key"], dtype=dtype)}
    request["STATE_DECAY_LOG_0"] = torch.zeros(1, *dims["decay_log"], dtype=dtype)  # expect-bug: imported-policy id=state-dtype
    module, zero = KDAReplayLayer(8, geometry, slots=1), torch.zeros(1, dtype=torch.int32)
    if act == torch.float16:  # ``state_mode: module`` instances warm the layer's own buffers
        module = module.half()  # expect-bug: module-cast id=module-half
    module(torch.ones(1, 8, dtype=module.qkv.weight.dtype), zero, zero)
    return {"first": first, "request": request, "module": module, "layer": layer.bfloat16()}

def warm_pool(pool: SequenceStatePool, layer: KDAReplayLayer) -> dict[str, torch.Tensor]:
    rings = pool.layers[0]
    kwargs = {"initial_state": rings["ssm_state"][:1], "d_cache": rings["delta"][:1], "k_cache": rings["key"][:1],
              "g_cache": rings["decay_log"][:1].to(rings["delta"].dtype)}  # expect-bug: decode-arg id=warm-kwargs
    return _launch(layer, **kwargs)

def build_warmup() -> dict:
    """Kernel warm-up for fp16/bf16, an fp16 instance's warm-up and a launch on a bf16 pool."""
    torch.manual_seed(2)
    geometry = RingGeometry()
    pool = SequenceStatePool(geometry, 1, 1, torch.bfloat16, pb_utils.replay_ring_dtypes("TYPE_BF16"))
    return {"kernel": warm_kernel(geometry), "instance": warm_instance(make_model_config(data_type="TYPE_FP16"), geometry),
            "pool": warm_pool(pool, KDAReplayLayer(8, geometry, slots=1, dtype=torch.bfloat16))}

def build_metrics() -> dict:
    """``nv_kda_*`` gauges after a launch on an fp16 pool, and a decay row appended to the ring by ``cat``."""
    torch.manual_seed(4)
    geometry = RingGeometry()
    rings = SequenceStatePool(geometry, 1, 1, torch.float16, pb_utils.replay_ring_dtypes("TYPE_FP16")).layers[0]
    layer = PinnedDecayLayer(8, geometry, slots=1).half()
    trace = _launch(layer, initial_state=rings["ssm_state"], d_cache=rings["delta"], k_cache=rings["key"], g_cache=rings["decay_log"])
    gauge_cache = {f"nv_kda_ring_bytes{{ring={ring}}}": float(t.view(torch.uint8).numel()) for ring, t in trace.items()}
    gauge_cache["nv_kda_decay_min"] = float(trace["decay_log"].min())
    row = torch.full((1, geometry.num_v_heads, 1, geometry.head_dim), -0.25, dtype=torch.float16)
    shifted = torch.cat([rings["decay_log"][:, :, 1:], row], dim=2)
    baseline = torch.zeros(geometry.num_v_heads, geometry.ring_len, geometry.head_dim)
    return {"trace": trace, "layer": layer, "shifted_decay_log": shifted, "baseline_decay_log": baseline,
            "like_decay_log": torch.zeros_like(rings["decay_log"]), "gauges": gauge_cache}
