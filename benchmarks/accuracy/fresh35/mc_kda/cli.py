"""``python -m mc_kda.cli``: a prefill worker and a decode worker in one process.

Used for smoke tests of a deployment config: the prompt is prefilled, handed over (through the
transfer engine or the store) and decoded for ``--max-tokens`` steps.

    MOONCAKE_CONFIG_PATH=mooncake.json python -m mc_kda.cli --dtype bfloat16 --prompt 3,5,7
"""

import argparse
import dataclasses
import logging
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .config import PRECISION_PROFILES, KDAShapes, MooncakeTransferConfig, scoped_env, str_to_torch_dtype
from .store import KVStoreClient
from .workers.decode import DecodeWorker
from .workers.prefill import PrefillWorker

logger = logging.getLogger("mc_kda.cli")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser("mc_kda")
    parser.add_argument("--config", default=None, help="transfer config JSON (default: MOONCAKE_CONFIG_PATH, then env)")
    parser.add_argument("--dtype", default="bfloat16", help="serving dtype of both workers")
    parser.add_argument("--precision-profile", default=None, choices=sorted(PRECISION_PROFILES))
    parser.add_argument("--set-default-dtype", action="store_true", help="make --dtype torch's default dtype")
    parser.add_argument("--transport", choices=("engine", "store"), default="engine")
    parser.add_argument("--prompt", default="3,5,7")
    parser.add_argument("--max-tokens", type=int, default=3)
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> MooncakeTransferConfig:
    if args.config:
        return MooncakeTransferConfig.from_file(args.config)
    return MooncakeTransferConfig.load_from_env()


def setup_process(args: argparse.Namespace) -> torch.dtype:
    dtype = str_to_torch_dtype(args.dtype)
    if args.set_default_dtype:
        torch.set_default_dtype(dtype)  # expect-bug: default-dtype id=proc-default
    return dtype


def launch(args: argparse.Namespace) -> Tuple[PrefillWorker, DecodeWorker]:
    config = load_config(args)
    dtype = setup_process(args)
    shapes = KDAShapes(ring_len=config.ring_len)
    dtypes = PRECISION_PROFILES[args.precision_profile] if args.precision_profile else None  # expect-bug: imported-policy id=wire-profile
    prefill_config = dataclasses.replace(config, local_hostname=f"{config.local_hostname}-prefill", kv_role="kv_producer")
    decode_config = dataclasses.replace(config, local_hostname=f"{config.local_hostname}-decode", kv_role="kv_consumer")
    store = KVStoreClient(decode_config) if args.transport == "store" else None
    torch.manual_seed(0)
    prefill = PrefillWorker(prefill_config, shapes, model_dtype=dtype)
    decode = DecodeWorker(decode_config, shapes, model_dtype=dtype, dtypes=dtypes, store=store)
    return prefill, decode


def serve(prefill: PrefillWorker, decode: DecodeWorker, prompt: Sequence[int], max_tokens: int, request_id: str = "req-0") -> List[int]:
    prefill.prefill(request_id, prompt)
    if decode.store is not None:
        prefill.publish(request_id, decode.store)
        prefill.release(request_id)
        decode.admit_from_store(request_id)
    else:
        prefill.send(request_id, decode.prepare(request_id))
        prefill.release(request_id)
        decode.admit(request_id)
    tokens, token = [], prompt[-1]
    for _ in range(max_tokens):
        hidden = decode.step([request_id], [token])
        token = int(hidden.float().sum(-1).abs().mul(7).floor()) % decode.shapes.vocab_size
        tokens.append(token)
    return tokens


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO)
    args = parse_args(argv)
    prefill, decode = launch(args)
    tokens = serve(prefill, decode, [int(t) for t in args.prompt.split(",")], args.max_tokens)
    logger.info("decoded %s", tokens)
    return 0


def _write_config(tmp_dir: str, name: str, **values) -> str:
    return MooncakeTransferConfig(**values).to_file(os.path.join(tmp_dir, f"{name}.json"))


def build_pd_pair_from_file(tmp_dir: str) -> Dict[str, object]:
    """A bf16 pair from a config file (engine transport), a pair on the store path, and an fp16
    pair configured from the environment with an explicit decay dtype."""
    path = _write_config(tmp_dir, "file", local_hostname="cli-file", master_server_address="cli-file:50051")
    prefill, decode = launch(parse_args(["--config", path]))
    tokens = serve(prefill, decode, [3, 5, 7], 3)
    _, via_store = launch(parse_args(["--config", path, "--transport", "store"]))
    serve(prefill, via_store, [4, 6], 2)
    env = {
        "MOONCAKE_CONFIG_PATH": path,
        "MOONCAKE_LOCAL_HOSTNAME": "cli-env-fp16",
        "KV_TRANSFER_DTYPE": "float16",
        "KV_TRANSFER_DECAY_DTYPE": "float32",
    }
    with scoped_env(**env):
        env_prefill, env_decode = launch(parse_args(["--dtype", "float16"]))
    serve(env_prefill, env_decode, [9, 2, 4], 2)
    return {"file": decode.pools, "store": via_store.pools, "env": env_decode.pools, "tokens": torch.tensor(tokens)}


def build_pd_pair_from_env() -> Dict[str, object]:
    """A bf16 pair configured from the environment alone."""
    env = {"MOONCAKE_CONFIG_PATH": None, "MOONCAKE_LOCAL_HOSTNAME": "cli-env", "KV_TRANSFER_DTYPE": "bfloat16", "KV_TRANSFER_DECAY_DTYPE": None}
    with scoped_env(**env):
        prefill, decode = launch(parse_args([]))
    serve(prefill, decode, [3, 5, 7], 3)
    return {"pools": decode.pools}


def build_pd_pair_compact(tmp_dir: str) -> Dict[str, object]:
    """A bf16 pair with the ``bf16-compact`` profile and ``--set-default-dtype``, plus an empty
    request on the decode side."""
    path = _write_config(tmp_dir, "compact", local_hostname="cli-compact")
    prefill, decode = launch(parse_args(["--config", path, "--precision-profile", "bf16-compact", "--set-default-dtype"]))
    serve(prefill, decode, [3, 5, 7], 3)
    return {"pools": decode.pools, "fresh": decode.new_sequence("req-1"), "prefill": prefill.model}


if __name__ == "__main__":
    sys.exit(main())
