"""Pre-converts a checkpoint for a strategy: ``python -m rwkv_kda.convert_model --in a.pth --out b.pth
--strategy "cpu bf16" [--state tuned.pth]``; ``--state`` merges a state tuning file, so every chat
starts from it. ``export_static_cache`` saves the static-batch server's cache with example inputs.
"""

import argparse

import torch

from . import strategy as strat
from .model import RWKV, convert_weights, tiny_weights
from .state_tuning import state_dict_of

def convert(w, strategy, state=None):
    n_layer = 1 + max(int(key.split(".")[1]) for key in w if key.startswith("blocks."))
    merged = {**w, **(state or {})}  # state: blocks.{i}.att.time_state / d_ring / k_ring / w_log_ring / pos
    return convert_weights(merged, strat.parse_strategy(strategy, n_layer), strategy)

def convert_and_save(src, dst, strategy, state_path=None):
    state = torch.load(state_path, map_location="cpu") if state_path else None
    torch.save(convert(torch.load(src, map_location="cpu"), strategy, state), dst)

def export_static_cache(model, slots, path=None):
    """The server's cache, and example inputs in the model's dtype for capturing its graphs."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(model.plans[0].atype)  # expect-bug: default-dtype id=export-dd
    try:
        cache = model.make_cache(slots)
        example = {"tokens": torch.zeros(slots, dtype=torch.long), "slots": torch.arange(slots, dtype=torch.int32),
                   "x": torch.randn(slots, model.args.n_embd)}
    finally:
        torch.set_default_dtype(previous)
    if path is not None:
        torch.save({"cache": cache.state_dict(), "example": example}, path)
    return cache, example

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--in", "--out", "--strategy", "--state"):
        parser.add_argument(flag, required=flag != "--state")
    args = vars(parser.parse_args(argv))
    convert_and_save(args["in"], args["out"], args["strategy"], args["state"])

def build_convert_with_state():
    w = tiny_weights()
    _, state = RWKV(w, "cpu fp32").forward([1, 3, 5, 7, 9], None)
    return {"w": convert(w, "cpu bf16", state_dict_of(state))}

def build_convert_for_strategy(tmp_dir):
    torch.save(tiny_weights(), f"{tmp_dir}/model.pth")
    convert_and_save(f"{tmp_dir}/model.pth", f"{tmp_dir}/model-bf16.pth", "cpu fp32 *1 -> cpu bf16")
    model = RWKV(f"{tmp_dir}/model-bf16.pth", "cpu fp32 *1 -> cpu bf16")
    out, state = model.forward([2, 4], model.init_state())
    return {"w": model.w, "out": out, **model.named_state(state)}

def build_export_static_cache(tmp_dir):
    cache, example = export_static_cache(RWKV(tiny_weights(), "cpu bf16"), 2, f"{tmp_dir}/cache.pth")
    return {"cache": cache, "example": example}

if __name__ == "__main__":
    main()
