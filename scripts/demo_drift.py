"""How far RL moved OpenVLA-style policies from their demonstrations, scored on recorded demo frames.

For each run: the NLL of the demonstrated 4-step chunks (sum over their tokens), the policy's token entropy
there, and the mean |greedy action - demonstrated action|; then the share of greedy tokens the later runs
share with the first. ``--stats-from RUN`` also scores the last run's weights with RUN's input statistics
(the state token's running normalizer), separating a drift of the statistics from one of the weights.

    python scripts/demo_drift.py runs/openvla-small-sft-libero runs/openvla-small-ppo-libero \
        --demos data/libero_spatial_0_f4_s3600.h5 data/libero_spatial_2_f4_s3600.h5 \
        --stats-from runs/openvla-small-sft-libero
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from robo_rl.build import policy_from_checkpoint
from robo_rl.runners.offline import flatten, load_demos


def demo_rows(paths: list[str], episodes: int, every: int, steps: int) -> tuple[dict, torch.Tensor]:
    """The SFT's own rows (``load_demos`` + ``flatten``: recorded frames, each with the ``steps`` actions after
    it) of the first ``episodes`` episodes per file, every ``every``-th row with a whole chunk: (obs, (N, steps, A))."""
    parts = [flatten(load_demos(p, ["rgb", "state"], False, episodes)[0], ["rgb", "state"], steps) for p in paths]
    obs: dict = {k: [] for k in ("rgb", "state", "instruction")}
    acts = []
    for d in parts:
        rows = np.flatnonzero(d.valid.all(1))[::every]
        obs["rgb"].append(d.obs["rgb"][rows]), obs["state"].append(d.obs["state"][rows]), acts.append(d.actions[rows])
        obs["instruction"] += [d.instruction[i] for i in rows]
    out = {k: torch.as_tensor(np.concatenate(obs[k])) for k in ("rgb", "state")}
    return {**out, "instruction": obs["instruction"]}, torch.as_tensor(np.concatenate(acts), dtype=torch.float32)


@torch.no_grad()
def score(policy, obs: dict, acts: torch.Tensor, batch: int = 16) -> tuple[float, float, float, torch.Tensor]:
    """(demo-chunk NLL, entropy, mean |greedy - demo| action error, greedy token indices)."""
    policy.eval()
    n = len(obs["instruction"])
    nll = ent = 0.0
    tokens = []
    for i in range(0, n, batch):
        o = {k: v[i:i + batch] for k, v in obs.items()}
        b = len(o["instruction"])
        loss, entropy = policy.imitation_loss(o, acts[i:i + batch])
        nll, ent = nll + float(loss) * b, ent + float(entropy) * b
        tokens.append(policy.act(o, deterministic=True).extras["action_index"])
    idx = torch.cat(tokens)
    greedy = policy._unnormalize(idx.view(n, acts.shape[1], acts.shape[2]))
    return nll / n, ent / n, float((greedy - acts).abs().mean()), idx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--demos", nargs="+", required=True)
    ap.add_argument("--episodes", type=int, default=16, help="episodes per demo file")
    ap.add_argument("--every", type=int, default=3, help="score every k-th recorded frame")
    ap.add_argument("--stats-from", help="also score the last run's weights with this run's input statistics")
    args = ap.parse_args()
    torch.set_num_threads(1)
    first = policy_from_checkpoint(args.runs[0])[0]
    steps = int(first.exec_steps)
    obs, acts = demo_rows(args.demos, args.episodes, args.every, steps)
    print(f"{len(acts)} demo frames, {steps}-step chunks")
    greedy = {}
    for run in args.runs:
        pol = first if run == args.runs[0] else policy_from_checkpoint(run)[0]
        nll, ent, err, greedy[run] = score(pol, obs, acts)
        print(f"{run}: demo-chunk NLL {nll:.2f}, entropy {ent:.2f}, |greedy - demo| {err:.3f}")
    for run in args.runs[1:]:
        print(f"greedy tokens equal to {args.runs[0]}: {run} {float((greedy[run] == greedy[args.runs[0]]).float().mean()):.3f}")
    if args.stats_from:
        last = policy_from_checkpoint(args.runs[-1])[0]
        source = policy_from_checkpoint(args.stats_from)[0]
        for name, buf in source.named_buffers():
            if name.startswith("state_norm."):
                last.get_buffer(name).copy_(buf)
        nll, ent, err, idx = score(last, obs, acts)
        same = float((idx == greedy[args.runs[0]]).float().mean())
        print(f"{args.runs[-1]} weights with {args.stats_from}'s statistics: demo-chunk NLL {nll:.2f}, "
              f"entropy {ent:.2f}, |greedy - demo| {err:.3f}, greedy tokens equal to {args.runs[0]} {same:.3f}")


if __name__ == "__main__":
    main()
