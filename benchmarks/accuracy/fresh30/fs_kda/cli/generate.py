#!/usr/bin/env python3 -u
"""Continue prompts with a trained model (``fairseq_cli/generate.py``, for language models).

    python -m fs_kda.cli.generate --path checkpoints/checkpoint_best.pt --fp16 --beam 4 \
        --prompts "3 4 5|6 7 8"

With ``--max-slots N`` the prompts are decoded greedily through a streaming slot pool instead
of beam search (what ``serve`` does for live requests).
"""

import argparse
import itertools
import logging
import os
import sys
from typing import Any, Dict, List

import torch

from fs_kda import checkpoint_utils, options, utils
from fs_kda.modules import kda_ops
from fs_kda.sequence_generator import SequenceGenerator

logger = logging.getLogger("fs_kda.cli.generate")


def main(args: argparse.Namespace) -> Dict[str, Any]:
    assert args.path is not None, "--path required for generation!"
    return _main(args, sys.stdout)


def _main(args: argparse.Namespace, output_file) -> Dict[str, Any]:
    use_cuda = torch.cuda.is_available() and not args.cpu
    torch.manual_seed(args.seed)

    # Load ensemble
    logger.info("loading model(s) from {}".format(args.path))
    models, _model_args = checkpoint_utils.load_model_ensemble(
        args.path.split(os.pathsep),
        arg_overrides=utils.parse_overrides(args.model_overrides),
        low_mem=args.low_mem_load,
    )

    # Optimize ensemble for generation
    for model in models:
        if model is None:
            continue
        if args.fp16:
            model.half()
        elif args.bf16:
            model.bfloat16()
        if use_cuda:
            model.cuda()
        model.prepare_for_inference_(args)

    if args.memory_efficient_fp16:
        # scores, masks and scratch tensors of the search follow the model
        torch.set_default_dtype(torch.float16)  # expect-bug: default-dtype id=mem-eff-default

    prompts = [[int(t) for t in p.split()] for p in args.prompts.split("|")]
    if args.max_slots > 0:
        return _stream(models[0], prompts, args, output_file)

    generator = SequenceGenerator(
        models,
        beam_size=args.beam,
        max_len_b=args.max_len_b,
        temperature=args.temperature,
        preallocate_state=args.preallocate_state,
        compact_state=args.compact_state,
    )
    results: Dict[str, Any] = {"hypos": [], "states": []}
    # no left-padding here: prompts of one batch have one length
    for length, group in itertools.groupby(sorted(prompts, key=len), key=len):
        src_tokens = torch.tensor(list(group))
        sample = {"net_input": {"src_tokens": src_tokens}}
        sample = utils.move_to_cuda(sample) if use_cuda else sample
        hypos = generator.generate(models, sample)
        for i, sentence in enumerate(hypos):
            for hypo in sentence[: args.nbest]:
                print(
                    "H-{}\t{:.4f}\t{}".format(i, float(hypo["score"]), " ".join(str(int(t)) for t in hypo["tokens"])),
                    file=output_file,
                )
        results["hypos"].append(hypos)
        results["states"].append(models[0].decoder.incremental_buffers(generator.last_incremental_states[0]))
    return results


def _stream(model: torch.nn.Module, prompts: List[List[int]], args: argparse.Namespace, output_file) -> Dict[str, Any]:
    """Greedy decoding of every prompt at once on the slots of the decoder's pool."""
    decoder = model.decoder
    pool = decoder.slot_pool
    pad = model.args.pad
    slots = torch.tensor([pool.alloc(f"prompt-{i}") for i in range(len(prompts))], dtype=torch.int32)
    last_logits: List[torch.Tensor] = [None] * len(prompts)
    with torch.no_grad():
        # prompts are fed one token per step; finished ones sit out as padding rows (slot -1)
        for t in range(max(len(p) for p in prompts)):
            active = torch.tensor([int(s) if t < len(p) else -1 for s, p in zip(slots, prompts)], dtype=torch.int32)
            tokens = torch.tensor([p[t] if t < len(p) else pad for p in prompts])
            logits = decoder.forward_slots(tokens, active)
            for i, p in enumerate(prompts):
                if t == len(p) - 1:
                    last_logits[i] = logits[i]
        next_tokens = torch.stack(last_logits).argmax(-1)
        outputs: List[List[int]] = [[] for _ in prompts]
        for _ in range(args.max_len_b):
            for i in range(len(prompts)):
                outputs[i].append(int(next_tokens[i]))
            next_tokens = decoder.forward_slots(next_tokens, slots).argmax(-1)
    for i, out in enumerate(outputs):
        print("S-{}\t{}".format(i, " ".join(map(str, out))), file=output_file)
    return {"tokens": outputs, "pool": pool, "last_decode": dict(kda_ops.last_decode_call())}


def cli_main(argv: List[str] = None) -> Dict[str, Any]:
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, argv)
    return main(args)


def _run(argv: List[str]) -> Dict[str, Any]:
    """``cli_main`` with stdout discarded, restoring torch's default dtype afterwards."""
    previous = torch.get_default_dtype()
    try:
        with open(os.devnull, "w") as devnull:
            return _main(options.parse_args_and_arch(options.get_generation_parser(), argv), devnull)
    finally:
        torch.set_default_dtype(previous)


def build_generate_fp16(tmp_dir: str) -> Dict[str, Any]:
    """``--fp16``: beam search with a pre-allocated state, and streaming on two slots."""
    path = checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "checkpoint_best.pt"))
    beam = _run(["--path", path, "--fp16", "--beam", "2", "--preallocate-state"])
    stream = _run(["--path", path, "--fp16", "--max-slots", "2", "--max-len-b", "5"])
    return {"beam_states": beam["states"], "stream": stream}


def build_generate_memory_efficient(tmp_dir: str) -> Dict[str, Any]:
    """``--memory-efficient-fp16`` beam search, with and without ``--preallocate-state``."""
    path = checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "checkpoint_best.pt"))
    lazy = _run(["--path", path, "--memory-efficient-fp16", "--beam", "2"])
    preallocated = _run(["--path", path, "--memory-efficient-fp16", "--beam", "2", "--preallocate-state"])
    return {"lazy": lazy["states"], "preallocated": preallocated["states"]}


def build_generate_edge_and_fp32_slots(tmp_dir: str) -> Dict[str, Any]:
    """An edge-architecture checkpoint with ``--fp16``, and ``--bf16`` streaming on a pool
    whose delta/key rings are kept in float32 (``--slot-ring-dtype float32``)."""
    edge = checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "edge.pt"), arch="kda_lm_edge")
    tiny = checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "tiny.pt"))
    edge_out = _run(["--path", edge, "--fp16", "--beam", "2"])
    stream = _run(["--path", tiny, "--bf16", "--max-slots", "2", "--slot-ring-dtype", "float32"])
    return {"edge_states": edge_out["states"], "stream": stream}


if __name__ == "__main__":
    cli_main()
