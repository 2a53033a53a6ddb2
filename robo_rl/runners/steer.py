"""`robo-rl steer collect | fit | eval`: the offline stage of RL^2 latent steering for a flow VLA.

collect: roll out the frozen base policy (its stochastic sampler) and log, per policy call, the
observation, the executed chunk (E, A), the return-to-go over the rest of the episode and whether the
episode failed (``np.savez``, written atomically). fit: train the failure predictor (BCE on "this
episode failed") and the latent velocity head (advantage-weighted flow matching, advantage = the
return-to-go minus a fitted value baseline, GAE(lambda) on that baseline, or the standardized return-to-go;
or, with ``--head mean``, the advantage shift of the chunk's mean) on those logs; the held-out AUROC of the
predictor is reported; the heads are saved with the base checkpoint's path. eval: success with 95% CIs of the base
policy with steering gated on predicted failure, always on, or off.

Env overrides (``env.key=value``) let collect and eval run on a variation of the training task (e.g.
an out-of-distribution camera or object pose through the simulators' variation hooks).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robo_rl.boundary import obs_to_torch, to_env_actions
from robo_rl.build import build_env, load_run, policy_from_checkpoint, with_num_envs
from robo_rl.contracts import Steerable
from robo_rl.errors import CheckpointError, ConfigError, RoboRLError
from robo_rl.files import atomic_path, check_replaceable, output_problem, replace_dir
from robo_rl.runners.steer_gate import fit_on_features, gate_monitor
from robo_rl.runners.steer_logs import base_fingerprint, check_log_base, check_log_fits, load_logs

log = logging.getLogger(__name__)


def _env_cfg(checkpoint: str, overrides: list[str], num_envs: int | None) -> Any:
    from robo_rl.config import apply_overrides, from_dict
    from robo_rl.run_config import TrainConfig

    bad = [o for o in overrides if not o.startswith("env.")]
    if bad:
        raise ConfigError(f"steer takes only env.* overrides (the policy is the checkpoint's); got {', '.join(bad)}")
    data = apply_overrides(load_run(checkpoint).meta["config"], overrides)
    env_cfg = from_dict(TrainConfig, data).env
    return with_num_envs(env_cfg, num_envs) if num_envs else env_cfg


def _flow_policy(checkpoint: str) -> Any:
    return _flow_policy_and_spec(checkpoint)[0]


def _flow_policy_and_spec(checkpoint: str) -> tuple[Any, dict[str, Any]]:
    """(the checkpoint's flow policy, its obs spec)."""
    policy, obs_spec, _ = policy_from_checkpoint(checkpoint)
    if not isinstance(policy, Steerable):
        raise ConfigError(f"'{checkpoint}' holds a {type(policy).__name__}; RL^2 steering needs a flow (pi0) policy")
    return policy, obs_spec


def _check_counts(what: str, **counts: int) -> None:
    """``episodes`` >= 1, ``steps`` >= 1, ``seed`` >= 0: one-line errors naming the flag."""
    for name, value in counts.items():
        least = 0 if name == "seed" else 1
        if value < least:
            raise ConfigError(f"{what} --{name} {value} must be >= {least}")


def _check_out_file(out: str, what: str) -> None:
    """A log file can be written at ``out``: not a directory, under a directory that exists or can be made."""
    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"{what} '{out}' is a directory; pass a file path such as '{path / 'log.npz'}'")
    problem = output_problem(path)
    if problem:
        raise ConfigError(f"{what} '{out}': {problem}; pass --out in a writable place")


def _is_steering_dir(path: Path) -> bool:
    return (path / "steering.json").is_file()


def _json_safe(value: Any) -> Any:
    """NaN/inf (e.g. an AUROC of a log with one outcome) as null: strict JSON readers reject NaN."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class ActionExploration:
    """Offsets delta ~ N(0, diag(scale^2)) (num_envs, A) added to a policy's env-unit actions (B, A) or chunks
    (B, H, A), held per env for its episode (``per="episode"``, redrawn by ``episode_done``) or redrawn every
    call (``per="call"``); scale = 0 leaves the actions as they are."""

    def __init__(self, scale: np.ndarray, num_envs: int, per: str, seed: int) -> None:
        self.scale, self.per = np.asarray(scale, np.float32), per
        self.rng = np.random.default_rng([seed, 1])
        self.offset = self._draw(num_envs)

    def _draw(self, n: int) -> np.ndarray:
        return self.rng.standard_normal((n, len(self.scale))).astype(np.float32) * self.scale

    def perturb(self, actions: torch.Tensor) -> torch.Tensor:
        if not self.scale.any():
            return actions
        if self.per == "call":
            self.offset = self._draw(len(self.offset))
        delta = torch.from_numpy(self.offset).to(actions.dtype)
        return actions + delta.view(delta.shape[0], *([1] * (actions.dim() - 2)), -1)

    def episode_done(self, env_id: int) -> None:
        self.offset[env_id] = self._draw(1)[0]


@torch.no_grad()
def collect(checkpoint: str, episodes: int, out: str, num_envs: int | None = None, seed: int = 0,
            overrides: list[str] | None = None, explore: float = 0.0, explore_per: str = "episode") -> dict[str, Any]:
    """Log ``episodes`` full episodes of the base policy; returns a summary.

    ``explore`` > 0 adds an offset delta ~ N(0, explore^2) in normalized action units (times the policy's
    action std in env units) to every executed step, held for a whole episode (``explore_per="episode"``) or
    redrawn per call (``"call"``); the log holds the executed actions. The frozen base's own sampling noise
    moves a chunk little (its actions barely vary at one observation), so its logs hold almost no action
    variation for the advantage weighting to choose from; a held offset explores the systematic corrections
    an OOD shift needs (one episode, one direction), which per-step noise averages away."""
    if not (np.isfinite(explore) and explore >= 0) or explore_per not in ("episode", "call"):
        raise ConfigError(f"steer collect --explore {explore} --explore-per {explore_per!r}: the scale is a finite "
                          "number >= 0 and the offset is held per 'episode' or per 'call'")
    _check_counts("steer collect", episodes=episodes, seed=seed)
    _check_out_file(out, "steer collect --out")
    policy = _flow_policy(checkpoint)
    env = build_env(_env_cfg(checkpoint, overrides or [], num_envs))
    explorer = ActionExploration(explore * policy.action_std[: policy.action_dim].cpu().numpy(), env.num_envs,
                                 explore_per, seed)
    rows: list[dict[str, Any]] = []
    open_rows: list[list[int]] = [[] for _ in range(env.num_envs)]
    # per-env quotas (as evaluate_policy): keeping the first episodes to finish would over-sample short,
    # successful ones, biasing the failure labels the predictor learns from
    quota = [episodes // env.num_envs + int(i < episodes % env.num_envs) for i in range(env.num_envs)]
    per_env = [0] * env.num_envs
    done_eps, successes = 0, 0
    try:
        obs, _ = env.reset(seed=seed)
        while done_eps < episodes:
            t_obs = obs_to_torch(obs)
            out_a = policy.act(t_obs)
            actions = to_env_actions(explorer.perturb(out_a.actions), env.action_spec)
            res = env.step(actions)
            for i in range(env.num_envs):
                rows.append({"rgb": obs["rgb"][i], "state": obs["state"][i] if "state" in obs else None,
                             "instruction": (obs.get("instruction") or [""] * env.num_envs)[i], "actions": actions[i],
                             "reward": float(res.reward[i]), "episode": -1})
                open_rows[i].append(len(rows) - 1)
                if res.terminated[i] or res.truncated[i]:
                    if per_env[i] < quota[i]:
                        per_env[i] += 1
                        ok = bool(res.info["success"][i])
                        rtg = 0.0
                        for r in reversed(open_rows[i]):
                            rtg += rows[r]["reward"]
                            rows[r].update(episode=done_eps, rtg=rtg, failed=not ok)
                        done_eps, successes = done_eps + 1, successes + int(ok)
                    open_rows[i] = []
                    explorer.episode_done(i)
            obs = res.obs
    finally:
        env.close()
    kept = [r for r in rows if r["episode"] >= 0]
    arrays = {"rgb": np.stack([r["rgb"] for r in kept]), "actions": np.stack([r["actions"] for r in kept]),
              "rtg": np.array([r["rtg"] for r in kept], np.float32), "failed": np.array([r["failed"] for r in kept]),
              "episode": np.array([r["episode"] for r in kept]), "instruction": np.array([r["instruction"] for r in kept])}
    if kept[0]["state"] is not None:
        arrays["state"] = np.stack([r["state"] for r in kept]).astype(np.float32)
    arrays["base_id"] = np.full(len(kept), base_fingerprint(checkpoint))
    path = Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, ".npz") as tmp:  # numpy appends .npz to any other name
            np.savez_compressed(tmp, **arrays)
    except OSError as err:
        raise RoboRLError(f"cannot write steering log '{path}' ({err.strerror or err}); pass --out in a writable place") from None
    return {"out": str(path), "episodes": done_eps, "success_rate": successes / max(1, done_eps), "calls": len(kept),
            "explore": explore, "explore_per": explore_per}


def _batch(data: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, Any]:
    obs: dict[str, Any] = {"rgb": torch.from_numpy(data["rgb"][idx]), "instruction": [str(s) for s in data["instruction"][idx]]}
    if "state" in data:
        obs["state"] = torch.from_numpy(data["state"][idx])
    return obs


@torch.no_grad()
def _pooled(model: Any, data: dict[str, np.ndarray], chunk: int = 64) -> torch.Tensor:
    """(N, F) pooled prefix features of every logged call (the frozen VLA's, computed once)."""
    n = len(data["rtg"])
    return torch.cat([model.base.prefix(_batch(data, np.arange(s, min(n, s + chunk))))[0].pooled.float()
                      for s in range(0, n, chunk)])


def _explained_variance(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(1.0 - (y - pred).var() / y.var().clamp_min(1e-12)) if y.numel() > 1 else float("nan")


def _episode_split(episode: np.ndarray, val_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, held-out rows) of a log: a ``val_fraction`` of its episodes held out whole."""
    eps = np.unique(episode)
    val_eps = set(rng.permutation(eps)[: max(1, int(round(len(eps) * val_fraction)))].tolist()) if len(eps) > 1 else set()
    is_val = np.array([e in val_eps for e in episode])
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def _advantages(cfg: Any, data: dict[str, np.ndarray], pooled: torch.Tensor, rtg: torch.Tensor, ret: torch.Tensor,
                train_idx: np.ndarray, val_idx: np.ndarray, steps: int, lr: float,
                rng: np.random.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """(advantages (N,) scaled to unit std on the training rows, the value baseline's explained variance)
    of the logged calls: the standardized returns ``ret`` as is, or minus a value baseline fitted on the
    pooled features (``cfg.advantage`` "value"), or GAE over it in return-to-go units ("gae")."""
    from robo_rl.algorithms.rl2 import ValueBaseline, episode_gae

    value_ev: dict[str, float] = {}
    if cfg.advantage in ("value", "gae"):
        mse = torch.nn.MSELoss()
        value = ValueBaseline(pooled.shape[1], cfg.hidden)
        fit_on_features(value, train_idx, lambda b: mse(value(pooled[b]), ret[b]), steps, lr, rng)
        with torch.no_grad():
            v = value(pooled)
        value_ev = {"value_ev_train": _explained_variance(v[train_idx], ret[train_idx]),
                    "value_ev_val": _explained_variance(v[val_idx], ret[val_idx]) if len(val_idx) else float("nan")}
        if cfg.advantage == "gae":  # in return-to-go units: V_rtg = std * V + mean
            v_rtg = v * (rtg[train_idx].std() + 1e-6) + rtg[train_idx].mean()
            adv = episode_gae(rtg, v_rtg, torch.from_numpy(data["episode"]), cfg.gae_lambda)
        else:
            adv = ret - v
    else:
        adv = ret
    return adv / (adv[train_idx].std() + 1e-6), value_ev


def _fit_head(model: Any, cfg: Any, data: dict[str, np.ndarray], pooled: torch.Tensor, adv: torch.Tensor,
              train_idx: np.ndarray, steps: int, batch_size: int, lr: float, rng: np.random.Generator) -> None:
    """Advantage-weighted flow matching of the steering head on the training rows."""
    from robo_rl.algorithms.rl2 import advantage_weights

    if cfg.head == "mean":  # on the cached prefix features: cheap, so batches of 256
        chunks, valid = model.normalized_chunks(torch.from_numpy(data["actions"]))
        w = advantage_weights(adv, cfg.temperature, cfg.max_weight)
        fit_on_features(model.head, train_idx, lambda b: model.head.loss(pooled[b], chunks[b], w[b], valid[b]), steps, lr, rng)
        return
    opt = torch.optim.Adam(model.head.parameters(), lr=lr)
    for step in range(steps):
        idx = rng.choice(train_idx, size=min(batch_size, len(train_idx)), replace=False)
        loss_v = model.steering_loss(_batch(data, idx), torch.from_numpy(data["actions"][idx]), adv[idx])
        opt.zero_grad(set_to_none=True)
        loss_v.backward()
        opt.step()
        if step % 100 == 0:
            log.info("steer fit step %d: velocity %.4f", step, loss_v.item())


def _save_steering(model: Any, summary: dict[str, Any], target: Path) -> None:
    """heads.safetensors + steering.json into a temporary sibling, then replace ``target`` with it."""
    import shutil
    import tempfile

    from safetensors.torch import save_file

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            save_file({f"head.{k}": v.contiguous() for k, v in model.head.state_dict().items()}
                      | {f"fail.{k}": v.contiguous() for k, v in model.fail.state_dict().items()}
                      | {f"scorer.{k}": v.contiguous() for k, v in model.scorer.state_dict().items()},
                      str(tmp / "heads.safetensors"))
            (tmp / "steering.json").write_text(json.dumps(summary, indent=2))  # last: marks a complete directory
            replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as err:
        raise RoboRLError(f"cannot write steering directory '{target}' ({err.strerror or err}); pass --out in a "
                          "writable place") from None


def _check_fit_args(gate: str, val_fraction: float | None, tau: float | str, steps: int, seed: int) -> float:
    """One-line errors for steer fit's arguments; returns the held-out share (0.5 with the conformal gate)."""
    if gate not in ("tau", "conformal"):
        raise ConfigError(f"steer fit --gate {gate!r}: choose 'tau' or 'conformal'")
    if val_fraction is None:
        val_fraction = 0.5 if gate == "conformal" else 0.2
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"steer fit --val-fraction {val_fraction}: the held-out share of episodes is in (0, 1)")
    if tau != "auto" and not isinstance(tau, (int, float)):
        raise ConfigError(f"steer fit --tau {tau!r}: a probability in [0, 1] or 'auto'")
    _check_counts("steer fit", steps=steps, seed=seed)
    return val_fraction


def fit(checkpoint: str, log_path: str | list[str], out: str, steps: int = 500, batch_size: int = 32, lr: float = 1e-3,
        val_fraction: float | None = None, seed: int = 0, tau: float | str = 0.5, fail_log: list[str] | None = None,
        gate: str = "tau", alpha: float = 0.1, **steering: Any) -> dict[str, Any]:
    """Train the steering head and the failure predictor on a collected log; save them to ``out``.

    ``fail_log``: train the failure predictor (and choose ``tau="auto"``) on these logs instead, e.g. the base's
    own rollouts when the head learns from exploring ones (``collect --explore``): the gate must predict the
    *base's* failure, which an exploring log's outcomes do not measure.

    The failure predictor (and, with ``advantage="value"`` or ``"gae"``, the value baseline) learn on the pooled prefix
    features, computed once; the velocity head then learns by advantage-weighted flow matching. Episodes
    are split into train / held-out (``val_fraction``: 0.2, or 0.5 with the conformal gate); ``tau="auto"`` sets
    the gate at the held-out Youden-optimal threshold. ``gate="conformal"``: time-indexed conformal bands
    with false-alarm rate ``alpha`` on successful episodes, calibrated on half of the held-out episodes and
    reported on the other half (``robo_rl.runners.steer_gate``).
    """
    from robo_rl.algorithms.rl2 import SteeringConfig, auroc, task_returns, youden_threshold
    from robo_rl.runners.steer_gate import fit_conformal, fit_scorer, split_heldout

    val_fraction = _check_fit_args(gate, val_fraction, tau, steps, seed)
    target = Path(out)
    try:
        check_replaceable(target, _is_steering_dir, "steering directory")  # before the fit, not after it
    except CheckpointError as err:
        raise ConfigError(f"steer fit --out: {err}") from None
    paths = [str(log_path)] if isinstance(log_path, (str, Path)) else [str(p) for p in log_path]
    data = load_logs(paths)
    try:
        cfg = SteeringConfig(tau=0.5 if tau == "auto" else float(tau), gate=gate, **steering)
    except ValueError as err:
        raise ConfigError(f"steer fit: {err}") from None
    torch.manual_seed(seed)  # before the heads are built: their initialization is part of the fit
    base, obs_spec = _flow_policy_and_spec(checkpoint)
    check_log_fits(data, base, obs_spec, ", ".join(f"'{p}'" for p in paths))
    check_log_base(data, checkpoint, ", ".join(f"'{p}'" for p in paths))
    model = base.steered(cfg)
    rng = np.random.default_rng(seed)
    train_idx, val_idx = _episode_split(data["episode"], val_fraction, rng)
    fail_paths = [str(p) for p in fail_log] if fail_log else paths
    fail_data = load_logs(fail_paths) if fail_log else data
    if fail_log:
        check_log_fits(fail_data, base, obs_spec, ", ".join(f"'{p}'" for p in fail_paths))
        check_log_base(fail_data, checkpoint, ", ".join(f"'{p}'" for p in fail_paths))
    f_train, f_val = _episode_split(fail_data["episode"], val_fraction, rng) if fail_log else (train_idx, val_idx)
    failed = torch.from_numpy(data["failed"].astype(np.float32))
    f_failed = torch.from_numpy(fail_data["failed"].astype(np.float32))
    calib = f_val if len(f_val) else f_train  # the rows tau="auto" is chosen on
    if gate == "conformal":  # checked before any fitting
        c_rows, t_rows = split_heldout(fail_data["episode"], fail_data["failed"], f_val, alpha, rng)
    if tau == "auto" and f_failed[calib].min() == f_failed[calib].max():
        raise ConfigError(f"steer fit --tau auto: the held-out episodes of {', '.join(fail_paths)} are all "
                          f"{'failures' if bool(f_failed[calib][0]) else 'successes'}; pass a fixed --tau or log more episodes")
    rtg = task_returns(torch.from_numpy(data["rtg"]), failed, cfg.returns)
    ret = (rtg - rtg[train_idx].mean()) / (rtg[train_idx].std() + 1e-6)

    pooled = _pooled(model, data)
    f_pooled = _pooled(model, fail_data) if fail_log else pooled
    bce = torch.nn.BCEWithLogitsLoss()
    fit_on_features(model.fail, f_train, lambda b: bce(model.fail(f_pooled[b]), f_failed[b]), steps, lr, rng)
    adv, value_ev = _advantages(cfg, data, pooled, rtg, ret, train_idx, val_idx, steps, lr, rng)
    _fit_head(model, cfg, data, pooled, adv, train_idx, steps, batch_size, lr, rng)
    value_ev.update(fit_scorer(model, data, pooled, train_idx, val_idx, steps, lr, rng))

    with torch.no_grad():
        scores = model.fail(f_pooled)
    summary = {"base": str(checkpoint), "log": paths, "fail_log": fail_paths, "steps": steps, "calls": int(len(data["rtg"])),
               "failure_rate": float(f_failed.mean()), "auroc_train": auroc(scores[f_train], f_failed[f_train]),
               "auroc_val": auroc(scores[f_val], f_failed[f_val]) if len(f_val) else float("nan"), **value_ev}
    if tau == "auto":
        cfg = dataclasses.replace(cfg, tau=youden_threshold(torch.sigmoid(scores[calib]), f_failed[calib]))
        model.cfg = cfg
    if gate == "conformal":
        model.bands, summary["gate_test"] = fit_conformal(scores, fail_data["episode"], fail_data["failed"], f_train,
                                                          c_rows, t_rows, alpha, int(getattr(base, "exec_steps", 1)))
        summary["conformal"] = model.bands.to_dict()
    summary["config"] = cfg.__dict__
    summary = _json_safe(summary)
    _save_steering(model, summary, target)
    return summary


def _by_gate(success: list[list[bool]], steered: list[list[bool]]) -> dict[str, Any]:
    """Success of the episodes the gate opened in vs those it did not (env i's k-th counted episode paired
    with the k-th episode the policy saw end in env i)."""
    groups: dict[bool, list[int]] = {True: [], False: []}
    for ok_env, st_env in zip(success, steered):
        for ok, st in zip(ok_env, st_env):
            groups[bool(st)].append(int(ok))
    return {f"{name}_episodes": {"episodes": len(v), "success_rate": (sum(v) / len(v)) if v else None}
            for name, v in (("steered", groups[True]), ("unsteered", groups[False]))}


def load_steered(checkpoint: str, steering_dir: str, tau: float | None = None, beta: float | None = None) -> Any:
    """The base policy with the saved heads (``tau`` overrides the saved gate threshold, ``beta`` the
    steering scale: beta > the fitted one extrapolates the advantage shift, as guidance does)."""
    from safetensors.torch import load_file

    from robo_rl.algorithms.rl2 import SteeringConfig
    meta_path = Path(steering_dir) / "steering.json"
    if not meta_path.is_file():
        raise ConfigError(f"'{steering_dir}' is not a steering directory (no steering.json); write one with 'robo-rl steer fit'")
    from safetensors import SafetensorError

    try:
        saved = json.loads(meta_path.read_text())["config"]
        saved.setdefault("baseline", False)  # written before the advantage-shift head: one plain head
        saved.setdefault("shared_head", False)  # written before the shared (flag-conditioned) head: two nets
        cfg = SteeringConfig(**saved)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"steering directory '{steering_dir}' has an unusable steering.json ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); fit it again with 'robo-rl steer fit'") from None
    if tau is not None:
        cfg = dataclasses.replace(cfg, tau=tau)
    if beta is not None:
        cfg = dataclasses.replace(cfg, beta=beta)
    model = _flow_policy(checkpoint).steered(cfg)
    heads = Path(steering_dir) / "heads.safetensors"
    try:
        state = load_file(str(heads))
    except (OSError, SafetensorError) as err:
        raise CheckpointError(f"steering weights '{heads}' are missing or corrupt ({str(err).splitlines()[0]}); fit "
                              "again with 'robo-rl steer fit'") from None
    model.has_scorer = any(k.startswith("scorer.") for k in state)  # fit before the verifier existed: none
    for name, module in (("head", model.head), ("fail", model.fail)) + ((("scorer", model.scorer),) if model.has_scorer else ()):
        part = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
        own = module.state_dict()
        bad = sorted(set(own) ^ set(part)) or sorted(k for k in own if tuple(own[k].shape) != tuple(part[k].shape))
        if bad:
            raise CheckpointError(f"steering directory '{steering_dir}' does not fit base '{checkpoint}' ({name}.{bad[0]} "
                                  f"differs); it was fit on {json.loads(meta_path.read_text()).get('base')!r}: "
                                  "pass that checkpoint, or fit again on this one")
        module.load_state_dict(part)
    if cfg.gate == "conformal":
        from robo_rl.algorithms.conformal import ConformalBands

        try:
            model.bands = ConformalBands.from_dict(json.loads(meta_path.read_text())["conformal"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"steering directory '{steering_dir}' has gate 'conformal' but no usable bands "
                                  f"({type(err).__name__}); fit it again with 'robo-rl steer fit --gate conformal'") from None
    return model.eval()


def evaluate(checkpoint: str, steering_dir: str, episodes: int, mode: str = "gated", seed: int = 10_000,
             num_envs: int | None = None, overrides: list[str] | None = None, tau: float | None = None,
             beta: float | None = None, stochastic: bool = False, samples: int = 1) -> dict[str, Any]:
    """Success of the steered policy: ``gated`` (the saved tau, or ``tau``), ``always`` or ``off``;
    ``beta`` overrides the fitted steering scale. ``stochastic`` starts each chunk's ODE from Gaussian
    noise, as pi0 is deployed (and as ``collect`` logs), instead of from x_0 = 0; torch is seeded with
    ``seed`` so the three modes draw the same noise stream (common random numbers). ``samples`` > 1: where
    the gate is open, the fitted scorer picks the best of that many composed chunks (test-time scaling);
    success is also reported apart for the episodes the gate opened in and those it did not."""
    from robo_rl.runners.evaluate import evaluate_policy

    taus = {"gated": tau, "always": -1.0, "off": None}
    if mode not in taus:
        raise ConfigError(f"steer eval --mode {mode!r}; choose one of {', '.join(taus)}")
    if tau is not None and (mode != "gated" or not 0.0 <= tau <= 1.0):
        raise ConfigError(f"steer eval --tau {tau}: a probability in [0, 1], and only with --mode gated")
    if beta is not None and not (beta > 0 and np.isfinite(beta)):
        raise ConfigError(f"steer eval --beta {beta}: the steering scale must be a finite number > 0 (use --mode off for none)")
    _check_counts("steer eval", episodes=episodes, seed=seed)
    if not (isinstance(samples, int) and 1 <= samples <= 64):
        raise ConfigError(f"steer eval --samples {samples}: composed samples per steered call, an integer in 1..64")
    model = load_steered(checkpoint, steering_dir, taus[mode], beta)
    if samples > 1 and not model.has_scorer:
        raise ConfigError(f"steer eval --samples {samples} needs the chunk scorer, which '{steering_dir}' lacks (fit "
                          "before it existed); fit it again with 'robo-rl steer fit'")
    model.samples = samples
    model.monitor = mode == "off"  # the fitted gate runs and is recorded; the actions are the base's
    if mode == "always" or tau is not None:  # always on / a fixed tau: the threshold gate
        model.cfg = dataclasses.replace(model.cfg, gate="tau")
    env = build_env(_env_cfg(checkpoint, overrides or [], num_envs))
    try:
        if stochastic:
            torch.manual_seed(seed)
        res = evaluate_policy(env, model, episodes, seed=seed, deterministic=not stochastic)
    finally:
        env.close()
    out = {"mode": mode, "stochastic": stochastic, "gate": model.cfg.gate, "samples": samples,
           **_by_gate(res.episode_success, model.episode_steered), "tau": model.cfg.tau, "beta": model.cfg.beta,
           "steered_fraction": model.rows_steered / max(1, model.rows_seen), **res.as_dict()}
    if mode == "off":
        out["gate_monitor"] = gate_monitor(res.episode_success, model.episode_steered, model.episode_excursion)
    return out
