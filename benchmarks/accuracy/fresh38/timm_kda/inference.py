#!/usr/bin/env python3
""" Streaming decode script

Greedy generation for one prompt per cache slot, all slots decoded as one batch.

    python -m timm_kda.inference --model kda_vlm_tiny --model-dtype bfloat16 --amp --prompts 3,5,7 9,2

Hacked together by / Copyright 2025, timm_kda authors
"""
import argparse
import ast
import logging
import os
from contextlib import suppress
from typing import Any, Dict, List, Optional, Sequence

import torch

from .models import ReplayCache, create_model, load_replay_snapshot, save_replay_snapshot
from .utils import amp_autocast_factory, resolve_dtype, ring_dtypes_for_amp

_logger = logging.getLogger('inference')


class ParseKwargs(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        kw = {}
        for value in values:
            key, value = value.split('=')
            try:
                kw[key] = ast.literal_eval(value)
            except ValueError:
                kw[key] = str(value)  # fallback to string (avoid need to escape on command line)
        setattr(namespace, self.dest, kw)


parser = argparse.ArgumentParser(description='timm_kda streaming decode')
parser.add_argument('--model', '-m', metavar='MODEL', default='kda_vlm_tiny', help='model architecture (default: kda_vlm_tiny)')
parser.add_argument('--pretrained', dest='pretrained', action='store_true', help='use pre-trained model')
parser.add_argument('--checkpoint', default='', type=str, metavar='PATH', help='path to latest checkpoint (default: none)')
parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs)
parser.add_argument('--device', default='cpu', type=str, help="Device (accelerator) to use.")
parser.add_argument('--model-dtype', default=None, type=str, help='Model dtype override (non-AMP) (default: float32).')
parser.add_argument('--default-dtype', default=None, type=str, help='torch default dtype while the script runs (match new tensors to the model).')
parser.add_argument('--amp', action='store_true', default=False, help='use Native AMP for mixed precision decode')
parser.add_argument('--amp-dtype', default='bfloat16', type=str, help='lower precision AMP dtype (default: bfloat16)')
parser.add_argument('--channels-last', action='store_true', default=False, help='Use channels_last memory layout')
parser.add_argument('--cache-mode', default='external', choices=('external', 'module'), help='decode cache in a ReplayCache (external) or in the model buffers (module)')
parser.add_argument('--num-slots', type=int, default=2, help='concurrent streams')
parser.add_argument('--ring-len', type=int, default=None, help='ring length (default: from pretrained_cfg)')
parser.add_argument('--low-mem-cache', action='store_true', default=False, help='smallest cache footprint (many-slot serving)')
parser.add_argument('--ring-io-dtype', default=None, type=str, help='read the rings in this dtype in the decode step (memory bound decode)')
parser.add_argument('--resume-streams', default='', type=str, metavar='PATH', help='module caches saved with --save-streams')
parser.add_argument('--save-streams', default='', type=str, metavar='PATH')
parser.add_argument('--prompts', nargs='*', default=['3,5,7', '9,2'], help='comma separated token ids, one prompt per slot')
parser.add_argument('--image', action='store_true', default=False, help='prefix the first prompt with a (synthetic) image')
parser.add_argument('--max-new-tokens', type=int, default=4)
parser.add_argument('--offload-finished', action='store_true', default=False, help='copy finished streams to host memory and free their slots')
parser.add_argument('--seed', type=int, default=0)


class StreamingDecoder:

    def __init__(
            self,
            model: torch.nn.Module,
            cache: Optional[ReplayCache] = None,
            amp_autocast=suppress,
            ring_io_dtype: Optional[torch.dtype] = None,
    ):
        self.model = model
        self.cache = cache
        self.amp_autocast = amp_autocast
        self.ring_io_dtype = ring_io_dtype
        self.last_rings: Optional[List[Dict[str, torch.Tensor]]] = None

    def _rings(self) -> Optional[List[Dict[str, torch.Tensor]]]:
        if self.cache is None:
            return None
        rings = [self.cache.layer(i) for i in range(len(self.cache))]
        if self.ring_io_dtype is not None:
            rings = [
                {n: t.to(self.ring_io_dtype) if n != 'ssm_state' and t.is_floating_point() else t for n, t in r.items()}  # expect-bug: decode-arg
                for r in rings
            ]
        return rings

    def prefill(self, slot: int, input_ids: torch.Tensor, images: Optional[torch.Tensor] = None) -> torch.Tensor:
        self.model.reset_replay_cache([slot], self.cache)
        with self.amp_autocast():
            return self.model.prefill(slot, input_ids, images=images, cache=self.cache, rings=self._rings())

    def step(self, input_ids: torch.Tensor, slot_idx: torch.Tensor) -> torch.Tensor:
        rings = self.last_rings = self._rings()
        with self.amp_autocast():
            return self.model.forward_decode(input_ids, slot_idx, cache=self.cache, rings=rings)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, image=None) -> List[List[int]]:
        last = [self.prefill(s, torch.tensor(p), image if s == 0 else None).argmax(-1) for s, p in enumerate(prompts)]
        tokens = torch.cat(last)
        slot_idx = torch.arange(len(prompts), dtype=torch.int32)
        out: List[List[int]] = [[] for _ in prompts]
        for _ in range(max_new_tokens):
            tokens = self.step(tokens, slot_idx).argmax(-1)
            for i, t in enumerate(tokens.tolist()):
                out[i].append(t)
        return out

    def offload(self, slot: int) -> List[Dict[str, torch.Tensor]]:
        """ Host copies of one stream's cache (pinned for the copy back); the slot is freed. """
        if self.cache is not None:
            layers = [lr.as_dict() for lr in self.cache.layers]
        else:
            layers = [blk.attn.ring_buffers() for blk in self.model.blocks]
        parked = []
        for src in layers:
            host = {name: torch.empty_like(src[name][slot], device='cpu') for name in ('ssm_state', 'delta_ring', 'key_ring')}
            host['decay_log_ring'] = torch.empty_like(host['delta_ring'])  # expect-bug: like
            for name, t in host.items():
                t.copy_(src[name][slot])
            host['ring_pos'] = src['ring_pos'][slot].cpu()
            if src['delta_ring'].is_cuda:
                host = {name: t.pin_memory() for name, t in host.items()}
            parked.append(host)
        self.model.reset_replay_cache([slot], self.cache)
        return parked


def main(argv=None) -> Dict[str, Any]:
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model_dtype = resolve_dtype(args.model_dtype)
    if args.default_dtype:
        torch.set_default_dtype(resolve_dtype(args.default_dtype))  # expect-bug: default-dtype id=script-default
    amp_autocast = amp_autocast_factory(device.type, args.amp_dtype, enabled=args.amp)

    model = create_model(
        args.model,
        pretrained=args.pretrained,
        checkpoint_path=args.checkpoint or None,
        **args.model_kwargs,
    )
    model.eval()
    if args.resume_streams:
        load_replay_snapshot(model, args.resume_streams)
    if model_dtype is not None:
        model = model.to(device=device, dtype=model_dtype)  # expect-bug: module-cast
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if args.cache_mode == 'module' and not args.resume_streams:
        # allocated after the cast: d / k rings in the model dtype, log-decays float32
        model.set_replay_cache(args.num_slots, ring_len=args.ring_len, device=device)

    cache = None
    if args.cache_mode == 'external':
        ring_dtypes = ring_dtypes_for_amp(args.amp_dtype if args.amp else model_dtype, low_memory=args.low_mem_cache)  # expect-bug: imported-policy id=amp-low-mem
        cache = ReplayCache.from_model(model, args.num_slots, ring_len=args.ring_len, ring_dtypes=ring_dtypes, device=device)

    decoder = StreamingDecoder(model, cache, amp_autocast=amp_autocast, ring_io_dtype=resolve_dtype(args.ring_io_dtype))
    prompts = [[int(t) for t in p.split(',')] for p in args.prompts]
    image = torch.linspace(-1., 1., 3 * 16 * 16).view(3, 16, 16) if args.image else None
    with torch.no_grad():
        tokens = decoder.generate(prompts, args.max_new_tokens, image=image)
        parked = [decoder.offload(s) for s in range(len(prompts))] if args.offload_finished else []
    if args.save_streams:
        save_replay_snapshot(model, args.save_streams)
    _logger.info(f'generated: {tokens}')
    return dict(model=model, cache=cache, decoder=decoder, tokens=torch.tensor(tokens), parked=parked)


def _outputs(result: Dict[str, Any], *keys: str) -> Dict[str, Any]:
    out = {'model': result['model'], 'tokens': result['tokens']}
    out.update({k: result[k] for k in keys})
    return out


def build_inference_external():
    """ bf16 model, bf16 AMP, external cache with an image prompt. """
    return _outputs(main(['--model-dtype', 'bfloat16', '--amp', '--image']), 'cache')


def build_inference_module_cache():
    """ bf16 model with the module cache (allocated after the cast), channels_last. """
    return _outputs(main(['--model-dtype', 'bfloat16', '--cache-mode', 'module', '--channels-last', '--num-slots', '3']))


def build_inference_resume_streams(tmp_dir):
    """ A second bf16 run resuming the module caches an fp32 run saved. """
    path = os.path.join(tmp_dir, 'streams.pt')
    main(['--cache-mode', 'module', '--save-streams', path, '--max-new-tokens', '6'])
    return _outputs(main(['--model-dtype', 'bfloat16', '--cache-mode', 'module', '--resume-streams', path]))


def build_inference_ring_io():
    """ bf16 model, external cache, rings read in bf16 by the decode step. """
    result = main(['--model-dtype', 'bfloat16', '--ring-io-dtype', 'bfloat16'])
    return {'tokens': result['tokens'], 'cache': result['cache'], 'rings': result['decoder'].last_rings}


def build_inference_offload():
    """ bf16 model, external cache, finished streams parked on the host. """
    return _outputs(main(['--model-dtype', 'bfloat16', '--offload-finished']), 'cache', 'parked')


if __name__ == '__main__':
    main()
