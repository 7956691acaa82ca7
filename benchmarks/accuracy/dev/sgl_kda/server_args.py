"""The server arguments that pick the cache dtypes."""

from dataclasses import dataclass

from .configs import DTYPE_MAP, ReplayRingDType


@dataclass
class ServerArgs:
    model_path: str = "moonshotai/Kimi-Linear-48B-A3B-Instruct"
    dtype: str = "bfloat16"
    mamba_ssm_dtype: str = "float32"
    replay_ring_dtype: str = "bfloat16"
    max_running_requests: int = 3


def replay_ring_dtype_from_args(server_args: ServerArgs) -> ReplayRingDType:
    ring = DTYPE_MAP[server_args.replay_ring_dtype]
    return ReplayRingDType(d=ring, k=ring, g=ring)  # expect-bug: imported-policy id=sgl-args


def replay_ring_dtype_from_args_fp32_gates(server_args: ServerArgs) -> ReplayRingDType:
    ring = DTYPE_MAP[server_args.replay_ring_dtype]
    return ReplayRingDType(d=ring, k=ring, g=DTYPE_MAP["float32"])
