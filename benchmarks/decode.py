"""Action-token decoding speed: our batched KV-cache decode vs a per-env loop vs transformers'
batched ``generate()``, on the same model, images and prompts, measured side by side.

All three decode greedily (identical work) and include the vision tower + projector; ``generate``
gets a logits processor that restricts it to the 256 action ids, as OpenVLA's ``predict_action``
effectively does. Rounds alternate between methods and the median per method is reported.

    robo-rl bench decode --batch 1 8 32 64                       # tiny random model, CPU
    robo-rl bench decode --checkpoint ~/.cache/robo-rl/openvla-mini --batch 1 8 32 64
    robo-rl bench decode --arch openvla-7b --device cuda --dtype bfloat16 --batch 1 8 32 64
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch

from benchmarks.output import check_min, check_output, sync, write_json


def _build(args: argparse.Namespace) -> Any:
    from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy

    cfg = OpenVLAConfig(arch=args.arch, checkpoint=args.checkpoint, dtype=args.dtype, max_prompt_tokens=args.prompt_tokens)
    with torch.device(args.device):
        policy = OpenVLAPolicy(cfg)
    return policy.to(args.device).eval()


def _generate(policy: Any, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from transformers import LogitsProcessor, LogitsProcessorList

    model = policy.model
    first, n = model.action_tokenizer.first_id, model.arch.n_action_bins

    class OnlyActions(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            out = torch.full_like(scores, float("-inf"))
            out[:, first:first + n] = scores[:, first:first + n]
            return out

    embeds, m, _ = model.embed_prefix(pixels, ids, mask)
    seq = model.language_model.generate(inputs_embeds=embeds, attention_mask=m, max_new_tokens=model.arch.action_dim,
                                        min_new_tokens=model.arch.action_dim, do_sample=False,
                                        logits_processor=LogitsProcessorList([OnlyActions()]),
                                        pad_token_id=model.arch.llm.pad_id, eos_token_id=None)
    return seq[:, -model.arch.action_dim:] - first


def _methods(policy: Any, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
             with_loop: bool) -> dict[str, Any]:
    """The three ways to decode the same batch greedily: name -> () -> (B, A) action indices."""
    from vla.openvla.decode import batch_decode

    def ours() -> torch.Tensor:
        return batch_decode(policy.model, pixels, ids, mask, greedy=True).index

    def loop() -> torch.Tensor:
        return torch.cat([batch_decode(policy.model, pixels[i:i + 1], ids[i:i + 1], mask[i:i + 1], greedy=True).index
                          for i in range(pixels.shape[0])])

    def gen() -> torch.Tensor:
        return _generate(policy, pixels, ids, mask)

    return {"ours": ours, "gen": gen, **({"loop": loop} if with_loop else {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="robo-rl bench decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="tiny", help="architecture preset for a random-init model (tiny, openvla-7b)")
    ap.add_argument("--checkpoint", default=None, help="local VLA directory instead of a random-init preset")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--loop-max-batch", type=int, default=64, help="skip the per-env loop above this batch")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", default=None, help="also write the results table to this JSON file")
    args = ap.parse_args(argv)
    check_min(ap, args, 1, "batch", "rounds", "prompt_tokens", "threads")
    check_min(ap, args, 0, "loop_max_batch")
    check_output(ap, args, "json")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    policy = _build(args)
    size = policy.model.arch.vision.image_size
    rng = np.random.default_rng(0)
    instructions = ["pick up the cube", "push the cube to the goal", "stack the red cube on the green cube",
                    "put the bowl on the plate"]
    rows = []
    print(f"model: {args.checkpoint or args.arch} ({sum(p.numel() for p in policy.parameters()) / 1e6:.1f} M params), "
          f"device {args.device}, {args.dtype}, threads {torch.get_num_threads()}")
    print(f"{'B':>4} {'ours act/s':>11} {'loop act/s':>11} {'generate act/s':>15} {'ours/loop':>10} {'ours/gen':>9} {'same tokens':>12}")
    for b in args.batch:
        obs = {"rgb": rng.integers(0, 255, (b, 1, size, size, 3), dtype=np.uint8),
               "instruction": [instructions[i % len(instructions)] for i in range(b)]}
        with torch.inference_mode():
            pixels = policy.pixels(obs["rgb"]).to(args.device)
            ids, mask = policy.prompts(obs, b)
            ids, mask = ids.to(args.device), mask.to(args.device)

            methods = _methods(policy, pixels, ids, mask, with_loop=b <= args.loop_max_batch)
            results: dict[str, torch.Tensor] = {}
            for fn in methods.values():  # warm-up
                fn()
            times: dict[str, list[float]] = {k: [] for k in methods}
            for _ in range(args.rounds):
                for name, fn in methods.items():
                    sync(args.device)
                    t0 = time.perf_counter()
                    results[name] = fn()
                    sync(args.device)
                    times[name].append(time.perf_counter() - t0)
        rate = {k: b / statistics.median(v) for k, v in times.items()}
        same = float((results["ours"] == results["gen"]).all(-1).float().mean())
        row = {"batch": b, "ours": rate["ours"], "loop": rate.get("loop"), "generate": rate["gen"],
               "ours_over_loop": rate["ours"] / rate["loop"] if "loop" in rate else None,
               "ours_over_generate": rate["ours"] / rate["gen"], "same_tokens_as_generate": same}
        rows.append(row)
        loop_s = f"{rate['loop']:11.1f}" if "loop" in rate else f"{'-':>11}"
        ratio_s = f"{row['ours_over_loop']:10.2f}" if row["ours_over_loop"] else f"{'-':>10}"
        print(f"{b:>4} {rate['ours']:11.1f} {loop_s} {rate['gen']:15.1f} {ratio_s} {row['ours_over_generate']:9.2f} {same:12.2f}")
    if args.json:
        write_json(args.json, {"model": args.checkpoint or args.arch, "device": args.device, "dtype": args.dtype, "rows": rows})
    return 0
