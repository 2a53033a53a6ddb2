"""Action-chunk sampling speed of the pi0-style VLA: the VLM prefix cached once per observation vs
recomputed at every denoising step, plus transformers' own ``sample_actions`` as a reference, on the
same model, images, prompts and initial noise, measured side by side (rounds alternate between the
methods; the median per method is reported). All run the deterministic Euler ODE, so their chunks
must agree; the table shows the largest difference.

    robo-rl bench sample --batch 1 8 32                         # small CPU preset
    robo-rl bench sample --arch pi0 --device cuda --dtype bfloat16 --batch 1 8 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch

from benchmarks.output import check_min, check_output, sync, write_json


def _methods(policy: Any, obs: dict[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    """name -> () -> (B, H, A) chunk, each the K-step ODE from x0."""
    from vla.pi0.sampling import SamplerConfig, sample, step_times

    model, ode, mask = policy.model, SamplerConfig("ode"), policy.log_prob_mask()
    arch = model.arch

    def cached() -> torch.Tensor:
        pre, state = policy.prefix(obs)
        return sample(model, pre, state, x0, ode, mask).actions

    def uncached() -> torch.Tensor:
        ts, dt = step_times(arch.num_steps, x0.device)
        x = x0
        for k in range(arch.num_steps):
            pre, state = policy.prefix(obs)  # the whole prefix again at every step
            v, _ = model.velocity(pre, state, x, ts[k].expand(x.shape[0]))
            x = x + dt * v
        return x

    def transformers_pi0() -> torch.Tensor:
        pixels = policy.pixels(obs["rgb"])
        ids, pmask = policy.prompts(obs, pixels.shape[0])
        img = torch.full((ids.shape[0], pixels.shape[1] * arch.tokens_per_image), arch.image_token_id, device=ids.device)
        return model.hf.sample_actions(policy.state(obs, ids.shape[0]).to(model.dtype), torch.cat([img, ids], 1),
                                       pixels.to(model.dtype), noise=x0.clone().to(model.dtype),
                                       attention_mask=torch.cat([torch.ones_like(img), pmask], 1),
                                       pixel_attention_mask=torch.ones(ids.shape[0], pixels.shape[1], dtype=torch.bool,
                                                                       device=ids.device)).float()

    return {"cached": cached, "uncached": uncached, "transformers": transformers_pi0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="robo-rl bench sample", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="small", help="pi0 architecture preset for a random-init model (tiny, small, pi0)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", default=None, help="also write the results table to this JSON file")
    args = ap.parse_args(argv)
    check_min(ap, args, 1, "batch", "rounds", "threads")
    check_output(ap, args, "json")
    from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.device(args.device):
        policy = Pi0Policy(Pi0PolicyConfig(arch=args.arch, sampler="ode", max_prompt_tokens=64))
    policy.model.to(torch.bfloat16 if args.dtype == "bfloat16" else torch.float32)
    policy = policy.to(args.device).eval()
    arch = policy.model.arch
    rng = np.random.default_rng(0)
    instructions = ["pick up the cube", "push the cube to the goal", "stack the red cube on the green cube",
                    "put the bowl on the plate"]
    n_params = sum(p.numel() for p in policy.parameters()) / 1e6
    print(f"model: pi0 {args.arch} ({n_params:.1f} M params), chunk {arch.chunk_size} x {arch.max_action_dim}, "
          f"{arch.num_steps} denoising steps, device {args.device}, {args.dtype}, threads {torch.get_num_threads()}")
    print(f"{'B':>4} {'cached chunk/s':>15} {'uncached chunk/s':>17} {'hf chunk/s':>11} {'cached act/s':>13} "
          f"{'cached/uncached':>16} {'cached/hf':>10} {'max |diff|':>11}")
    rows = []
    for b in args.batch:
        obs = {"rgb": torch.from_numpy(rng.integers(0, 255, (b, arch.cameras, arch.image_size, arch.image_size, 3),
                                                    dtype=np.uint8)),
               "state": torch.from_numpy(rng.normal(size=(b, 8)).astype(np.float32)),
               "instruction": [instructions[i % len(instructions)] for i in range(b)]}
        x0 = torch.randn(b, arch.chunk_size, arch.max_action_dim, device=args.device)
        with torch.inference_mode():
            methods = _methods(policy, obs, x0)
            out = {name: fn() for name, fn in methods.items()}  # warm-up, and the outputs to compare
            times: dict[str, list[float]] = {k: [] for k in methods}
            for _ in range(args.rounds):
                for name, fn in methods.items():
                    sync(args.device)
                    t0 = time.perf_counter()
                    fn()
                    sync(args.device)
                    times[name].append(time.perf_counter() - t0)
        rate = {k: b / statistics.median(v) for k, v in times.items()}
        diff = max(float((out[k] - out["cached"]).abs().max()) for k in out)
        row = {"batch": b, "cached_chunks_per_s": rate["cached"], "uncached_chunks_per_s": rate["uncached"],
               "transformers_chunks_per_s": rate["transformers"], "cached_actions_per_s": rate["cached"] * arch.chunk_size,
               "cached_over_uncached": rate["cached"] / rate["uncached"],
               "cached_over_transformers": rate["cached"] / rate["transformers"], "max_abs_diff": diff}
        rows.append(row)
        print(f"{b:>4} {rate['cached']:15.2f} {rate['uncached']:17.2f} {rate['transformers']:11.2f} "
              f"{row['cached_actions_per_s']:13.1f} {row['cached_over_uncached']:16.2f} "
              f"{row['cached_over_transformers']:10.2f} {diff:11.2e}")
    if args.json:
        write_json(args.json, {"arch": args.arch, "device": args.device, "dtype": args.dtype, "rows": rows})
    return 0
