"""The command lines ``python -m mlx_fpqmm.convert`` and ``python -m mlx_fpqmm.generate``.

They live here rather than in ``mlx_fpqmm/convert.py``: the package attribute
``mlx_fpqmm.convert`` is the function :func:`mlx_fpqmm.nn.convert`, and
``mlx_fpqmm/convert.py`` is only the ``-m`` entry point (see its docstring).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._formats import FORMATS, resolve_mode


def convert_parser() -> argparse.ArgumentParser:
    """``mlx_lm.convert``'s options that apply, with ``--mode`` for all five formats."""
    from mlx_lm.convert import MODEL_CONVERSION_DTYPES, QUANT_RECIPES

    parser = argparse.ArgumentParser(
        prog="python -m mlx_fpqmm.convert",
        description="Convert a Hugging Face model to an MLX model quantized by mlx_fpqmm.",
    )
    parser.add_argument(
        "--hf-path",
        "--model",
        type=str,
        required=True,
        help="Path to the model. This can be a local path or a Hugging Face Hub model identifier.",
    )
    parser.add_argument(
        "--mlx-path", type=str, default="mlx_model", help="Path to save the MLX model."
    )
    parser.add_argument(
        "--mode",
        "--q-mode",
        type=str,
        default="mxfp4",
        choices=list(FORMATS),
        help="The quantization mode (fp4 and fp8 load with mlx_fpqmm.load only).",
    )
    parser.add_argument(
        "--group-size",
        "--q-group-size",
        type=int,
        default=None,
        help="Group size for quantization (default: the mode's).",
    )
    parser.add_argument(
        "-q",
        "--quantize",
        action="store_true",
        help="Always on (taken for mlx_lm.convert's command lines).",
    )
    parser.add_argument(
        "--q-bits",
        type=int,
        default=None,
        help="The mode's bits, if given (taken for mlx_lm.convert's command lines).",
    )
    parser.add_argument(
        "--global-scale",
        action="store_true",
        help="nvfp4 only: a float32 tensor scale per layer (per expert for experts); "
        "such models load with mlx_fpqmm.load only.",
    )
    parser.add_argument(
        "--quant-predicate",
        choices=QUANT_RECIPES,
        type=str,
        required=False,
        help="Mixed recipe (mlx-lm's): its high-bit layers get the mode's 8-bit sibling "
        "(mxfp8 for mxfp4/nvfp4, fp8 for fp4).",
    )
    parser.add_argument(
        "--dtype",
        type=str,
        choices=MODEL_CONVERSION_DTYPES,
        default=None,
        help="Type to save the non-quantized parameters. Defaults to config.json's "
        "`torch_dtype` or the current model weights dtype.",
    )
    parser.add_argument(
        "--revision", type=str, default=None, help="Hugging Face Hub revision to load."
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=False,
        help="Trust remote code when loading tokenizer.",
    )
    return parser


def _user_errors(parser: argparse.ArgumentParser, model_path: str, run: Callable[[], Any]) -> Any:
    """``run()``, with a mistake of the user's (a bad path or repository, an output that
    exists, an option the model does not take) as the parser's one-line error."""
    try:
        return run()
    except (ValueError, OSError) as error:
        message = str(error)
        # Not found on the Hub: say that it is no directory here either.
        if type(error).__module__.startswith("huggingface_hub") and not Path(model_path).exists():
            message += f" ({model_path} is not a local directory either)"
        parser.error(message)


def convert_main(argv: Sequence[str] | None = None) -> None:
    from ._lm import convert_checkpoint

    parser = convert_parser()
    args = parser.parse_args(argv)
    if args.global_scale and args.mode != "nvfp4":
        parser.error("--global-scale needs --mode nvfp4")
    try:  # before the model loads
        resolve_mode(args.mode, args.group_size, args.q_bits)
    except ValueError as error:
        parser.error(str(error))
    _user_errors(
        parser,
        args.hf_path,
        lambda: convert_checkpoint(
            args.hf_path,
            args.mlx_path,
            mode=args.mode,
            group_size=args.group_size,
            global_scale=args.global_scale,
            dtype=args.dtype,
            quant_predicate=args.quant_predicate,
            revision=args.revision,
            trust_remote_code=args.trust_remote_code,
        ),
    )


def generate_main(argv: Sequence[str] | None = None) -> None:
    """``mlx_lm.generate``'s common path (its own argument parser) with :func:`mlx_fpqmm.load`."""
    import mlx.core as mx
    from mlx_lm.generate import DEFAULT_MODEL, generate, setup_arg_parser
    from mlx_lm.sample_utils import make_sampler

    from ._lm import load

    parser = setup_arg_parser()
    parser.prog = "python -m mlx_fpqmm.generate"
    # mlx_lm.generate's options that this path does not take: refused when given, and
    # not offered in --help.
    unsupported_options = (
        "prompt_cache_file",
        "image",
        "quantize_activations",
    )
    for action in parser._actions:
        if action.dest in unsupported_options:
            action.help = argparse.SUPPRESS
    parser.add_argument(
        "--fuse-projections",
        action="store_true",
        help="multiply the projections that read one x as one product "
        "(mlx_fpqmm.nn.fuse_projections: q/k/v, gate/up or w1/w3, the experts' gate/up, "
        "DeepSeek's q_a/kv_a)",
    )
    args = parser.parse_args(argv)
    unsupported = [
        name
        for name in unsupported_options
        if getattr(args, name, None) != parser.get_default(name)
    ]
    if unsupported:
        flags = ", ".join("--" + n.replace("_", "-") for n in unsupported)
        parser.error(f"{flags}: use mlx_lm.generate for these")
    if args.seed is not None:
        mx.random.seed(args.seed)
    tokenizer_config = {"trust_remote_code": args.trust_remote_code}
    model, tokenizer = _user_errors(
        parser,
        args.model or DEFAULT_MODEL,
        lambda: load(
            args.model or DEFAULT_MODEL,
            adapter_path=args.adapter_path,
            tokenizer_config=tokenizer_config,
            trust_remote_code=args.trust_remote_code,
        ),
    )
    draft_model = None
    if args.draft_model is not None:
        draft_model, draft_tokenizer = _user_errors(
            parser, args.draft_model, lambda: load(args.draft_model)
        )
        if draft_tokenizer.vocab_size != tokenizer.vocab_size:
            parser.error("--draft-model: its tokenizer does not match the model's")
    if args.fuse_projections:
        from .nn import fuse_projections

        fused = fuse_projections(model)
        print(f"[mlx_fpqmm] {len(fused)} layers fused into groups of one product", file=sys.stderr)
    for eos_token in args.extra_eos_token:
        tokenizer.add_eos_token(eos_token)
    prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")
    prompt = sys.stdin.read() if prompt == "-" else prompt
    use_chat_template = not args.ignore_chat_template and tokenizer.has_chat_template
    if use_chat_template:
        messages = []
        if args.system_prompt is not None:
            messages.append({"role": "system", "content": args.system_prompt})
        messages.append({"role": "user", "content": prompt})
        prefill = args.prefill_response is not None
        if prefill:
            messages.append({"role": "assistant", "content": args.prefill_response})
        template_kwargs = {}
        if args.chat_template_config is not None:
            try:
                template_kwargs = json.loads(args.chat_template_config)
            except ValueError as error:
                parser.error(f"--chat-template-config: not JSON ({error})")
        prompt = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            continue_final_message=prefill,
            add_generation_prompt=not prefill,
            **template_kwargs,
        )
    prompt = tokenizer.encode(prompt, add_special_tokens=not use_chat_template)
    sampler = make_sampler(
        args.temp,
        args.top_p,
        args.min_p,
        args.min_tokens_to_keep,
        top_k=args.top_k,
        xtc_probability=args.xtc_probability,
        xtc_threshold=args.xtc_threshold,
        xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids),
    )
    response = generate(
        model,
        tokenizer,
        prompt,
        max_tokens=args.max_tokens,
        verbose=args.verbose,
        sampler=sampler,
        max_kv_size=args.max_kv_size,
        prefill_step_size=args.prefill_step_size,
        kv_bits=args.kv_bits,
        kv_group_size=args.kv_group_size,
        quantized_kv_start=args.quantized_kv_start,
        draft_model=draft_model,
        num_draft_tokens=args.num_draft_tokens,
    )
    if not args.verbose:
        print(response)
