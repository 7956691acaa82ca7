"""Command-line options (``fairseq/options.py``)."""

import argparse
from typing import Callable, List, Optional

from fs_kda.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


def get_parser(desc: str, default_task: str = "language_modeling") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    # fmt: off
    parser.add_argument('--no-progress-bar', action='store_true', help='disable progress bar')
    parser.add_argument('--log-format', default=None, help='log format to use',
                        choices=['json', 'none', 'simple', 'tqdm'])
    parser.add_argument('--seed', default=1, type=int, metavar='N',
                        help='pseudo random number generator seed')
    parser.add_argument('--cpu', action='store_true', help='use CPU instead of CUDA')
    parser.add_argument('--fp16', action='store_true', help='use FP16')
    parser.add_argument('--bf16', action='store_true', help='use BF16 format'
                        ' Currently --bf16 is an added argument with --fp16 for mixed precision bf16 training'
                        ' or with --memory-efficient-fp16 for pure bf16 training.')
    parser.add_argument('--memory-efficient-bf16', action='store_true',
                        help='use a memory-efficient version of BF16 training; implies --bf16')
    parser.add_argument('--memory-efficient-fp16', action='store_true',
                        help='use a memory-efficient version of FP16 training; implies --fp16')
    parser.add_argument('--task', metavar='TASK', default=default_task, help='task')
    # fmt: on
    return parser


def add_checkpoint_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("Checkpointing")
    # fmt: off
    group.add_argument('--path', metavar='FILE', help='path(s) to model file(s), colon separated')
    group.add_argument('--model-overrides', default="{}", type=str, metavar='DICT',
                       help='a dictionary used to override model args at generation '
                            'that were used during model training')
    group.add_argument('--low-mem-load', action='store_true',
                       help='build the model directly in the --fp16/--bf16 dtype before loading weights')
    # fmt: on
    return group


def add_generation_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("Generation")
    add_checkpoint_args(parser)
    # fmt: off
    group.add_argument('--beam', default=2, type=int, metavar='N', help='beam size')
    group.add_argument('--nbest', default=1, type=int, metavar='N', help='number of hypotheses to output')
    group.add_argument('--max-len-b', default=4, type=int, metavar='N', help='generate sequences of maximum length b')
    group.add_argument('--temperature', default=1., type=float, metavar='N', help='temperature for generation')
    group.add_argument('--preallocate-state', action='store_true',
                       help='allocate the incremental state of the whole batch before the prompt')
    group.add_argument('--compact-state', action='store_true',
                       help='keep cached rings in half precision between beam-search steps')
    group.add_argument('--max-slots', type=int, default=0, metavar='N',
                       help='decode through a streaming slot pool of N slots instead of beam search')
    group.add_argument('--slot-ring-dtype', type=str, default=None, metavar='DTYPE',
                       help='storage of the delta/key rings of the slot pool (default: the model dtype)')
    group.add_argument('--prompts', type=str, default="3 4 5|6 7", help='|-separated prompts of token ids')
    # fmt: on
    return group


def add_interactive_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("Interactive")
    # fmt: off
    group.add_argument('--session-dir', type=str, default=None, help='where idle sessions are offloaded')
    group.add_argument('--fp16-snapshots', action='store_true', help='offload idle sessions in fp16')
    group.add_argument('--batch-bucket', type=int, default=0, metavar='N',
                       help='pad batched steps to a multiple of N sessions')
    # fmt: on
    return group


def add_serving_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("Serving")
    # fmt: off
    group.add_argument('--ring-len', type=int, default=None, metavar='L', help='ring rows of the server pool')
    group.add_argument('--max-requests', type=int, default=4, metavar='N', help='requests served concurrently')
    # fmt: on
    return group


def get_training_parser(default_task: str = "language_modeling") -> argparse.ArgumentParser:
    parser = get_parser("Trainer", default_task)
    group = parser.add_argument_group("Model configuration")
    # fmt: off
    group.add_argument('--arch', '-a', metavar='ARCH', choices=ARCH_MODEL_REGISTRY.keys(),
                       help='model architecture')
    # fmt: on
    return parser


def get_generation_parser(interactive: bool = False, default_task: str = "language_modeling") -> argparse.ArgumentParser:
    parser = get_parser("Generation", default_task)
    add_generation_args(parser)
    if interactive:
        add_interactive_args(parser)
    return parser


def get_interactive_generation_parser(default_task: str = "language_modeling") -> argparse.ArgumentParser:
    return get_generation_parser(interactive=True, default_task=default_task)


def get_serve_parser() -> argparse.ArgumentParser:
    parser = get_parser("Serve")
    add_generation_args(parser)
    add_serving_args(parser)
    return parser


def parse_args_and_arch(
    parser: argparse.ArgumentParser,
    input_args: Optional[List[str]] = None,
    parse_known: bool = False,
    modify_parser: Optional[Callable[[argparse.ArgumentParser], None]] = None,
) -> argparse.Namespace:
    """Parses ``input_args``; with ``--arch``, also that architecture's model arguments."""
    if modify_parser is not None:
        modify_parser(parser)

    # The parser doesn't know about model-specific args, so we parse twice.
    args, _ = parser.parse_known_args(input_args)

    # Add model-specific args to parser.
    if getattr(args, "arch", None) is not None:
        model_specific_group = parser.add_argument_group(
            "Model-specific configuration",
            # Only include attributes which are explicitly given as command-line
            # arguments or which have default values.
            argument_default=argparse.SUPPRESS,
        )
        ARCH_MODEL_REGISTRY[args.arch].add_args(model_specific_group)

    if parse_known:
        args, extra = parser.parse_known_args(input_args)
    else:
        args = parser.parse_args(input_args)
        extra = None

    # Post-process args.
    if getattr(args, "memory_efficient_bf16", False):
        args.bf16 = True
    if getattr(args, "memory_efficient_fp16", False):
        args.fp16 = True

    # Apply architecture configuration.
    if getattr(args, "arch", None) in ARCH_CONFIG_REGISTRY:
        ARCH_CONFIG_REGISTRY[args.arch](args)

    if parse_known:
        return args, extra
    return args
