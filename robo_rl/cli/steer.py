"""`robo-rl steer collect | fit | online | eval`: RL^2 latent steering of a flow policy."""

from __future__ import annotations

import argparse

from robo_rl.cli.evaluate import emit_eval


def cmd_steer(args: argparse.Namespace) -> int:
    from robo_rl import checkpoint as ckpt_io
    from robo_rl.runners import steer

    ckpt_io.allow_large_models(args.allow_large)
    if args.steer_command == "collect":
        out = steer.collect(args.checkpoint, args.episodes, args.out, args.num_envs, args.seed or 0, args.overrides,
                            explore=args.explore, explore_per=args.explore_per)
    elif args.steer_command == "fit":
        out = steer.fit(args.checkpoint, args.log, args.out, steps=args.steps, beta=args.beta, tau=args.tau,
                        baseline=not args.no_baseline, advantage=args.advantage, temperature=args.temperature,
                        shared_head=not args.two_heads, gae_lambda=args.gae_lambda, head=args.head,
                        returns=args.returns, fail_log=args.fail_log, gate=args.gate, alpha=args.alpha,
                        val_fraction=args.val_fraction)
    elif args.steer_command == "online":
        from robo_rl.runners.steer_online import train_online

        out = train_online(args.checkpoint, args.steering, args.out, args.iterations, args.episodes, args.num_envs,
                           20_000 if args.seed is None else args.seed, args.lr, args.epochs, args.clip, args.noise_level,
                           args.overrides, tau=args.tau, beta=args.beta)
    else:
        out = steer.evaluate(args.checkpoint, args.steering, args.episodes, args.mode,
                             10_000 if args.seed is None else args.seed, args.num_envs, args.overrides, tau=args.tau,
                             beta=args.beta, stochastic=args.stochastic, samples=args.samples)
    emit_eval(out, args.out if args.steer_command == "eval" else None)  # collect/fit/online's --out is their own
    return 0
