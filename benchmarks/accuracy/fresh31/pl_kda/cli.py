"""Command line: ``python -m pl_kda.cli {predict,export,serve} [--precision ...]``.

* ``predict`` runs ``Trainer.predict`` with the callback-owned decode rings;
* ``export`` turns a checkpoint (or a fresh module) into a ``KDADecoder`` for the serving
  workers, optionally in half precision;
* ``serve`` prepares the decode state a serving worker starts from.
"""

import argparse
from typing import Any, Dict, List, Optional, Sequence

import torch

from pl_kda.callbacks import PredictDecodeState
from pl_kda.config import RING_STORAGE_DTYPES, DecodeStateConfig, KDAConfig
from pl_kda.datamodule import PromptDataModule
from pl_kda.lite import Trainer
from pl_kda.modeling import KDADecoder
from pl_kda.module import KDALitModule
from pl_kda.state import allocate_replay_state


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pl_kda")
    parser.add_argument("command", choices=("predict", "export", "serve"))
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--num-slots", type=int, default=2)
    parser.add_argument("--tokens-per-batch", type=int, default=3)
    parser.add_argument("--num-batches", type=int, default=2)
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument("--half", action="store_true", help="export the decoder in float16")
    return parser.parse_args(argv)


def cli_predict(args: argparse.Namespace) -> Dict[str, Any]:
    module = KDALitModule(max_slots=args.num_slots)
    data = PromptDataModule(num_slots=args.num_slots, tokens_per_batch=args.tokens_per_batch, num_batches=args.num_batches)
    owner = PredictDecodeState(num_slots=args.num_slots)
    trainer = Trainer(precision=args.precision, callbacks=[owner])
    predictions = trainer.predict(module, data, ckpt_path=args.ckpt_path)
    tokens = torch.stack([p["next_token"] for p in predictions])
    return {"module": module, "datamodule": data, "predict_state": owner, "tokens": tokens}


def cli_export(args: argparse.Namespace) -> KDADecoder:
    if args.ckpt_path:
        module = KDALitModule.load_from_checkpoint(args.ckpt_path)
    else:
        module = KDALitModule(max_slots=args.num_slots)
        module.configure_model()
    decoder = KDADecoder.from_model(module.model, num_slots=args.num_slots)
    if args.half:
        decoder = decoder.half()  # expect-bug: module-cast
    return decoder


def cli_serve(args: argparse.Namespace) -> Dict[str, Any]:
    config = KDAConfig()
    ring_dtype = RING_STORAGE_DTYPES[args.precision]  # expect-bug: imported-policy id=serve-rings
    decode = DecodeStateConfig(max_slots=args.num_slots, delta_dtype=ring_dtype, key_dtype=ring_dtype, gate_dtype=ring_dtype)  # expect-bug: imported-policy id=serve-rings
    state = allocate_replay_state(config, decode.max_slots, decode.ring_dtypes())
    return {"decode": decode, "state": state}


def main(argv: Optional[Sequence[str]] = None) -> Any:
    args = parse_args(argv)
    return {"predict": cli_predict, "export": cli_export, "serve": cli_serve}[args.command](args)


def build_cli_export_and_serve() -> Dict[str, Any]:
    """``export --half`` and ``serve --precision bf16-true``."""
    torch.manual_seed(0)
    decoder = main(["export", "--half"])
    with torch.no_grad():
        decoder(torch.tensor([3, 4]), torch.arange(2, dtype=torch.int32))
    return {"decoder": decoder, "serve": main(["serve", "--precision", "bf16-true"])}


def build_cli_predict_mixed() -> Dict[str, Any]:
    """``predict --precision bf16-mixed`` and ``serve --precision 32-true``."""
    torch.manual_seed(0)
    return {"predict": main(["predict", "--precision", "bf16-mixed"]), "serve": main(["serve", "--precision", "32-true"])}


if __name__ == "__main__":
    main()
