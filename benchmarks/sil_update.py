"""GRPO's update with self-imitation (``algo.sil_coef`` > 0) on the pi0-style VLA: the log-probs and the
flow-matching term from one prefix pass (``score_and_imitate``: the VLM embeds images and prompt once per
minibatch) vs two passes (``token_log_probs`` / ``evaluate``, then ``self_imitation_loss``), with the update
without the term as the floor. The same weights, batch and seeds for every method; rounds alternate between
the methods and the median per method is reported. The two ways take the same step (tests/vla).

    robo-rl bench sil                                   # small CPU preset, 32 and 128 transitions
    robo-rl bench sil --arch small --transitions 256 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.output import check_min, check_output, sync, write_json

METHODS = ("one pass", "two passes", "no self-imitation")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="robo-rl bench sil", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="small", help="pi0 architecture preset for a random-init model (tiny, small, pi0)")
    ap.add_argument("--transitions", type=int, nargs="+", default=[32, 128], help="chunk calls in the batch")
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", default=None, help="also write the results table to this JSON file")
    args = ap.parse_args(argv)
    check_min(ap, args, 1, "transitions", "minibatches", "rounds", "threads")
    check_output(ap, args, "json")
    from robo_rl.algorithms.grpo import GRPO, GRPOConfig
    from robo_rl.batch import RolloutBatch
    from vla.pi0.policy import Pi0Policy, Pi0PolicyConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = Pi0PolicyConfig(arch=args.arch, sampler="sde", noise_level=0.5, exec_steps=4, max_prompt_tokens=64)
    torch.manual_seed(0)
    fused = Pi0Policy(cfg).to(args.device)
    two_passes = type("TwoPasses", (Pi0Policy,), {"score_and_imitate": None})(cfg).to(args.device)
    two_passes.load_state_dict(fused.state_dict())  # the same weights; None blocks the capability
    policies = {"one pass": fused, "two passes": two_passes, "no self-imitation": fused}
    arch = fused.model.arch
    n_params = sum(p.numel() for p in fused.parameters()) / 1e6
    print(f"model: pi0 {args.arch} ({n_params:.1f} M params), {arch.cameras} x {arch.image_size} px, Flow-SDE, "
          f"device {args.device}, threads {torch.get_num_threads()}; GRPO, 1 epoch, {args.minibatches} minibatches")
    print(f"{'N':>5} {'one pass s':>11} {'two passes s':>13} {'no SIL s':>9} {'two/one':>8} {'one/no SIL':>11}")
    rng = np.random.default_rng(0)
    rows = []
    for n in args.transitions:
        obs = {"rgb": torch.from_numpy(rng.integers(0, 255, (n, arch.cameras, arch.image_size, arch.image_size, 3),
                                                    dtype=np.uint8)),
               "state": torch.from_numpy(rng.normal(size=(n, 8)).astype(np.float32)),
               "instruction": ["put the black bowl on the plate"] * n}
        with torch.no_grad():
            out = fused.act(obs)
        stored = {k: v for k, v in obs.items() if k != "instruction"}
        adv = torch.from_numpy(rng.normal(size=n).astype(np.float32))
        batch = RolloutBatch(stored, out.extras, out.log_prob, out.value, adv, adv)
        times: dict[str, list[float]] = {k: [] for k in METHODS}
        for r in range(args.rounds + 1):  # round 0 warms up
            for name in METHODS:
                policy = policies[name].train()
                algo = GRPO(GRPOConfig(lr=1e-12, epochs=1, minibatches=args.minibatches,
                                       sil_coef=0.0 if name == "no self-imitation" else 1.0), policy)
                torch.manual_seed(r)
                sync(args.device)
                t0 = time.perf_counter()
                algo.update(batch)
                sync(args.device)
                if r:
                    times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"transitions": n, "one_pass_s": med["one pass"], "two_passes_s": med["two passes"],
               "no_sil_s": med["no self-imitation"], "two_over_one": med["two passes"] / med["one pass"],
               "one_over_no_sil": med["one pass"] / med["no self-imitation"]}
        rows.append(row)
        print(f"{n:>5} {row['one_pass_s']:11.3f} {row['two_passes_s']:13.3f} {row['no_sil_s']:9.3f} "
              f"{row['two_over_one']:8.2f} {row['one_over_no_sil']:11.2f}")
    if args.json:
        write_json(args.json, {"arch": args.arch, "device": args.device, "rows": rows})
    return 0
