"""OpenVLA-style VLA: tokenizer, batch decoding vs teacher forcing, PPO direction, BC, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robo_rl.algorithms.bc import BC, BCConfig
from robo_rl.algorithms.ppo import PPO, PPOConfig
from robo_rl.batch import RolloutBatch
from robo_rl.contracts import ArraySpec
from robo_rl.errors import CheckpointError, ConfigError
from vla.openvla.decode import batch_decode
from vla.openvla.policy import OpenVLAConfig, OpenVLAPolicy
from vla.openvla.text import PromptTooLong
from vla.openvla.tokenizer import ActionTokenizer, NormStats

SPEC = ArraySpec((7,), "float32", -1.0, 1.0)
INSTR = ["pick up the cube", "push the cube to the goal", "a", "stack the red cube on the green cube"]


def _policy(**kw) -> OpenVLAPolicy:
    torch.manual_seed(0)
    return OpenVLAPolicy(OpenVLAConfig(**kw), {"rgb": ArraySpec((1, 40, 40, 3), "uint8")}, SPEC).eval()


def _obs(b: int = 4, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"rgb": rng.integers(0, 255, (b, 1, 40, 40, 3), dtype=np.uint8), "instruction": [INSTR[i % 4] for i in range(b)]}


def test_tokenizer_matches_openvla_formula_and_round_trips():
    tok = ActionTokenizer(32000, 256)
    assert tok.first_id == 31744
    # OpenVLA: id = vocab - digitize(a, linspace(-1, 1, 256)); a = 1 -> 31744, a = -1 -> 31999
    assert tok.encode(np.array([1.0, -1.0, 0.0])).tolist() == [31744, 31999, 32000 - int(np.digitize(0.0, tok.bins))]
    a = np.random.default_rng(0).uniform(-1, 1, (10000, 7))
    ids = tok.encode(a)
    assert ids.min() >= 31744 and ids.max() <= 31999
    err = np.abs(tok.decode(ids) - a).max()
    assert err <= tok.bin_width / 2 + 1e-6
    # out-of-range actions clip to the edge bins
    assert tok.encode(np.array([5.0, -5.0])).tolist() == [31744, 31999]


def test_norm_stats_exclude_the_gripper_and_invert():
    acts = np.random.default_rng(1).normal(0, 0.3, (500, 7))
    acts[:, -1] = np.sign(acts[:, -1])
    st = NormStats.from_actions(acts, mask=(True,) * 6 + (False,))
    n = st.normalize(acts)
    assert n.min() >= -1 and n.max() <= 1
    np.testing.assert_array_equal(n[:, -1], acts[:, -1])
    inside = np.all((acts[:, :6] >= st.q01[:6]) & (acts[:, :6] <= st.q99[:6]), axis=1)
    np.testing.assert_allclose(st.unnormalize(n)[inside], acts[inside], atol=1e-5)


def test_norm_stats_errors_name_the_key():
    stats = {"bridge_orig": NormStats((0.0,) * 7, (1.0,) * 7, (True,) * 7).to_dict()}
    with pytest.raises(CheckpointError, match="fractal.*bridge_orig"):
        NormStats.from_norm_stats(stats, "fractal")
    with pytest.raises(CheckpointError, match="choose one with unnorm_key"):
        NormStats.from_norm_stats({**stats, "other": stats["bridge_orig"]}, None)


@pytest.mark.parametrize("arch,chunk,exec_steps,shape", [("tiny", 1, None, (4, 7)), ("small", 1, None, (4, 7)),
                                                         ("tiny", 4, 2, (4, 2, 7)), ("small", 3, None, (4, 3, 7))])
def test_decode_log_probs_equal_teacher_forced_evaluate(arch, chunk, exec_steps, shape):
    torch.manual_seed(0)
    p = _policy(temperature=0.8, arch=arch, chunk=chunk, exec_steps=exec_steps)
    obs = _obs()
    n_tok = int(np.prod(shape[1:]))  # only the executed actions' tokens are decoded and scored
    with torch.no_grad():
        out = p.act(obs)
        lp, ent, v = p.evaluate(obs, out.extras)
        v2 = p.value(obs)
        # per token, as decoded (KV cache, one token at a time) and as teacher-forced (one pass)
        ids, mask = p.prompts(obs, 4)
        dec = batch_decode(p.model, p.pixels(obs["rgb"]), ids, mask, p.cfg.temperature, extra=p._extra(obs),
                           n_tokens=n_tok)
        tf = p.token_log_probs(obs, {"action_index": dec.index, "prompt_ids": ids, "prompt_mask": mask})
    assert out.actions.shape == shape and out.extras["action_index"].shape == (4, n_tok)
    torch.testing.assert_close(tf, dec.log_prob, atol=1e-5, rtol=0)
    # an action's log-prob sums n_tok float32 terms (|sum| ~ 100 for 21 tokens, where one ulp is 8e-6)
    torch.testing.assert_close(lp, out.log_prob, atol=1e-5 * n_tok, rtol=0)
    torch.testing.assert_close(v, out.value, atol=1e-5, rtol=0)
    torch.testing.assert_close(v2, out.value, atol=1e-5, rtol=0)
    assert torch.all(ent > 0) and torch.all(ent <= n_tok * np.log(256) + 1e-4)
    # the actions are the stored tokens, time-major: action t's A tokens are tokens t*A .. t*A+A-1
    torch.testing.assert_close(out.actions.reshape(4, -1, 7),
                               p._unnormalize(out.extras["action_index"].reshape(4, -1, 7)), atol=0, rtol=0)


def test_chunk_bc_masks_steps_past_the_episode_and_fits_the_chunk():
    p = _policy(chunk=3)
    obs = _obs(8)
    tobs = {"rgb": torch.from_numpy(obs["rgb"]), "instruction": obs["instruction"]}
    rng = np.random.default_rng(4)
    expert = torch.from_numpy(rng.uniform(-0.9, 0.9, (8, 3, 7)).astype(np.float32))
    valid = torch.ones(8, 3, dtype=torch.bool)
    valid[::2, 2] = False  # the episode ended after two steps for half the rows
    other = expert.clone()
    other[~valid] = torch.from_numpy(rng.uniform(-0.9, 0.9, (int((~valid).sum()), 7)).astype(np.float32))
    algo = BC(BCConfig(dataset="unused.h5", lr=3e-3), p)
    with torch.no_grad():  # what lies past the end does not count ...
        torch.testing.assert_close(algo.loss(tobs, expert, valid)[0], algo.loss(tobs, other, valid)[0])
        # ... and a row's NLL sums its valid tokens: with everything valid the loss is larger
        assert float(algo.loss(tobs, other, torch.ones_like(valid))[0]) > float(algo.loss(tobs, expert, valid)[0])
    p.train()
    first = algo.update((tobs, expert, valid))["nll"]
    for _ in range(80):
        last = algo.update((tobs, expert, valid))["nll"]
    assert last < 0.2 * first
    p.eval()
    with torch.no_grad():
        greedy = p.act(tobs, deterministic=True).actions
    assert greedy.shape == (8, 3, 7)
    assert float((greedy - expert)[valid].abs().max()) <= 2 / 255 + 1e-5


def test_batched_decode_equals_per_env_decode():
    p = _policy()
    obs = _obs()
    with torch.no_grad():
        px = p.pixels(obs["rgb"])
        ids, mask = p.prompts(obs, 4)
        batched = batch_decode(p.model, px, ids, mask, greedy=True)
        for i in range(4):
            one = batch_decode(p.model, px[i:i + 1], ids[i:i + 1], mask[i:i + 1], greedy=True)
            assert torch.equal(one.index[0], batched.index[i])
            torch.testing.assert_close(one.log_prob[0], batched.log_prob[i], atol=1e-5, rtol=0)


def test_ppo_update_raises_log_prob_of_advantaged_tokens():
    p = _policy()
    obs = _obs(8)
    with torch.no_grad():
        out = p.act(obs)
    t_obs = {"rgb": torch.from_numpy(obs["rgb"])}
    adv = torch.tensor([1.0, -1.0] * 4)
    batch = RolloutBatch(t_obs, out.extras, out.log_prob, out.value, adv, out.value + adv)
    algo = PPO(PPOConfig(lr=1e-3, epochs=4, minibatches=1, target_kl=None, norm_adv=False, value_lr=1e-3), p)
    p.train()
    algo.update(batch)
    with torch.no_grad():
        new_lp, _, _ = p.evaluate(t_obs, out.extras)
    delta = new_lp - out.log_prob
    assert torch.all(delta[adv > 0] > 0) and torch.all(delta[adv < 0] < 0)
    assert len(algo.optimizer.param_groups) == 2  # value head on its own learning rate


def test_critic_warmup_leaves_the_actor_untouched():
    p = _policy()
    obs = _obs(4)
    with torch.no_grad():
        out = p.act(obs)
    t_obs = {"rgb": torch.from_numpy(obs["rgb"])}
    batch = RolloutBatch(t_obs, out.extras, out.log_prob, out.value, torch.ones(4), torch.full((4,), 2.0))
    algo = PPO(PPOConfig(epochs=2, minibatches=1, critic_warmup_iters=1, value_loss="huber"), p)
    before = {k: v.clone() for k, v in p.model.state_dict().items()}
    p.train()
    stats = algo.update(batch)
    assert stats["critic_warmup"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in p.model.state_dict().items())
    with torch.no_grad():
        assert float(p.value(obs).mean()) > 0.0  # the critic moved towards the returns


@pytest.mark.parametrize("detach", [False, True])
def test_value_detach_keeps_the_value_loss_out_of_the_trunk(detach):
    p = _policy(value_detach=detach)
    obs = _obs(4)
    with torch.no_grad():
        out = p.act(obs)
    torch.nn.init.normal_(p.value_head[2].weight)  # the last layer starts at zero: give the input a gradient path
    _, _, value = p.evaluate({"rgb": torch.from_numpy(obs["rgb"])}, out.extras)
    ((value - 1.0) ** 2).mean().backward()
    trunk = [q.grad for q in p.model.parameters() if q.requires_grad]
    assert all(g is not None for g in (q.grad for q in p.value_head.parameters()))
    assert any(g is not None and bool(g.abs().sum() > 0) for g in trunk) is not detach


def test_bc_fits_expert_actions():
    p = _policy()
    obs = _obs(8)
    expert = torch.from_numpy(np.random.default_rng(3).uniform(-0.9, 0.9, (8, 7)).astype(np.float32))
    tobs = {"rgb": torch.from_numpy(obs["rgb"]), "instruction": obs["instruction"]}
    algo = BC(BCConfig(dataset="unused.h5", lr=3e-3), p)
    p.train()
    first = algo.update((tobs, expert))["nll"]
    for _ in range(60):
        last = algo.update((tobs, expert))["nll"]
    assert last < 0.2 * first
    p.eval()
    with torch.no_grad():
        greedy = p.act(tobs, deterministic=True).actions
    assert float((greedy - expert).abs().max()) <= 2 / 255 + 1e-5  # within one bin of the expert


def test_bad_inputs_fail_clearly():
    p = _policy(max_prompt_tokens=40)
    obs = _obs(2)
    with pytest.raises(PromptTooLong, match="max_prompt_tokens = 40"):
        p.act(obs)
    p = _policy()
    with pytest.raises(ValueError, match="must be uint8"):
        p.act({"rgb": obs["rgb"].astype(np.float32), "instruction": obs["instruction"]})
    with pytest.raises(ValueError, match=r"shape \(B, V, H, W, 3\)"):
        p.act({"rgb": obs["rgb"][:, 0], "instruction": obs["instruction"]})
    with pytest.raises(ConfigError, match="needs an 'rgb' observation"):
        OpenVLAPolicy(OpenVLAConfig(), {"state": ArraySpec((9,), "float32")}, SPEC)
    with pytest.raises(ConfigError, match="not a preset"):
        OpenVLAConfig(arch="huge")
    with pytest.raises(ConfigError, match=r"policy.exec_steps' = 5 must be in \[1, policy.chunk = 4\]"):
        OpenVLAConfig(chunk=4, exec_steps=5)
    with pytest.raises(ConfigError, match="policy.chunk' = 0"):
        OpenVLAConfig(chunk=0)


def test_lora_trains_adapters_only_and_saves_merged(tmp_path):
    p = _policy(lora_rank=4, freeze_vision=True)
    trainable = {n for n, q in p.named_parameters() if q.requires_grad}
    assert trainable and all("lora_" in n or n.startswith(("value_head", "model.projector")) for n in trainable)
    obs = _obs(4)
    with torch.no_grad():
        out = p.act(obs)
    t_obs = {"rgb": torch.from_numpy(obs["rgb"])}
    adv = torch.ones(4)
    algo = PPO(PPOConfig(lr=1e-2, epochs=3, minibatches=1, target_kl=None, norm_adv=False), p)
    p.train()
    algo.update(RolloutBatch(t_obs, out.extras, out.log_prob, out.value, adv, out.value + adv))
    p.eval()
    with torch.no_grad():
        tuned = p.evaluate(t_obs, out.extras)[0]
        assert torch.all(tuned > out.log_prob)
        saved = p.save_pretrained(tmp_path / "merged")
        plain = OpenVLAPolicy(OpenVLAConfig(checkpoint=str(saved)), {"rgb": ArraySpec((1, 40, 40, 3), "uint8")}, SPEC).eval()
        torch.testing.assert_close(plain.evaluate(t_obs, out.extras)[0], tuned, atol=1e-4, rtol=0)
        torch.testing.assert_close(p.evaluate(t_obs, out.extras)[0], tuned, atol=1e-6, rtol=0)  # unmerged again


def test_state_token_policy_decodes_and_recomputes_identically():
    torch.manual_seed(0)
    spec = {"rgb": ArraySpec((1, 40, 40, 3), "uint8"), "state": ArraySpec((9,), "float32")}
    p = OpenVLAPolicy(OpenVLAConfig(state_token=True), spec, SPEC).eval()
    obs = {**_obs(3), "state": np.random.default_rng(0).normal(size=(3, 9)).astype(np.float32)}
    p.update_normalizer({"state": torch.from_numpy(obs["state"])})
    with torch.no_grad():
        out = p.act(obs)
        lp, _, v = p.evaluate(obs, out.extras)
        other = p.evaluate({**obs, "state": obs["state"] + 1.0}, out.extras)[0]
    torch.testing.assert_close(lp, out.log_prob, atol=1e-5, rtol=0)
    torch.testing.assert_close(v, out.value, atol=1e-5, rtol=0)
    assert not torch.allclose(other, lp)  # the state reaches the action distribution
    with pytest.raises(ConfigError, match="needs a 'state' observation"):
        OpenVLAPolicy(OpenVLAConfig(state_token=True), {"rgb": spec["rgb"]}, SPEC)


def test_batchnorm_tower_scores_the_same_in_train_mode():
    """PPO evaluates in train mode what was sampled in eval mode: BatchNorm must not switch to batch stats."""
    from vla.openvla.model import LLMArch, OpenVLAModel, VLAArch
    from vla.openvla.vision import VisionArch

    torch.manual_seed(0)
    model = OpenVLAModel(VLAArch(VisionArch("mobilenet", 64, 32, 1280, 0, 0, 0), LLMArch(), "gelu-mlp", 256, 7))
    p = OpenVLAPolicy(OpenVLAConfig(), {"rgb": ArraySpec((1, 64, 64, 3), "uint8")}, SPEC, model=model).eval()
    obs = {"rgb": np.random.default_rng(0).integers(0, 255, (4, 1, 64, 64, 3), dtype=np.uint8), "instruction": INSTR}
    with torch.no_grad():
        out = p.act(obs)
        p.train()
        lp, _, _ = p.evaluate(obs, out.extras)
    assert p.training and not p.model.vision_backbone.featurizer.features[0][1].training
    torch.testing.assert_close(lp, out.log_prob, atol=1e-4, rtol=0)


def test_mobilenet_folded_conv_bn_equals_conv_then_batchnorm():
    """The tower runs Conv2d -> eval BatchNorm2d folded into one conv: same features and gradients as
    the two modules in turn (torchvision's function), with pretrained-like, non-trivial BN statistics."""
    from vla.openvla.vision import VisionArch, VisionBackbone

    torch.manual_seed(0)
    tower = VisionBackbone(VisionArch("mobilenet", 64, 32, 1280, 0, 0, 0)).eval()
    for m in tower.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.5), m.running_var.uniform_(0.5, 2.0), m.weight.data.normal_(1, 0.3), m.bias.data.normal_(0, 0.3)

    def unfolded(x: torch.Tensor) -> torch.Tensor:
        def seq(mods: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
            for m in mods:
                h = seq(m, h) if isinstance(m, torch.nn.Sequential) else (
                    (h + seq(m.conv, h) if m.use_res else seq(m.conv, h)) if hasattr(m, "use_res") else m(h))
            return h
        fmap = seq(tower.featurizer.features, x)
        return fmap.flatten(2).transpose(1, 2)  # (B, h*w, C)

    x = torch.randn(2, 3, 64, 64)
    folded, ref = tower(x), unfolded(x)
    assert folded.shape == (2, 4, 1280)
    torch.testing.assert_close(folded, ref, atol=1e-4, rtol=1e-4)
    conv, bn = tower.featurizer.features[0][0], tower.featurizer.features[0][1]
    grads = []
    for fn in (tower, unfolded):
        tower.zero_grad()
        (fn(x) ** 2).mean().backward()
        grads.append((conv.weight.grad.clone(), bn.weight.grad.clone(), bn.bias.grad.clone()))
    for g_fold, g_ref in zip(*grads):
        torch.testing.assert_close(g_fold, g_ref, atol=1e-4, rtol=1e-3)


def test_save_refuses_other_directories_and_load_refuses_inconsistent_norm_stats(tmp_path, monkeypatch):
    """save_pretrained replaces only a robo-rl OpenVLA directory (never a user's directory, never '.'), and
    a checkpoint whose norm stats have another action dim than its model is refused on load."""
    import json

    p = OpenVLAPolicy(OpenVLAConfig(), {"rgb": ArraySpec((1, 40, 40, 3), "uint8")}, SPEC).eval()
    saved = p.save_pretrained(tmp_path / "ckpt")
    p.save_pretrained(tmp_path / "ckpt")  # our own: replaced, nothing left beside it
    assert sorted(f.name for f in tmp_path.iterdir()) == ["ckpt"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="exists and is not a robo-rl OpenVLA checkpoint; refusing to overwrite"):
        p.save_pretrained(tmp_path / "mine")
    monkeypatch.chdir(tmp_path / "mine")
    with pytest.raises(CheckpointError, match="not a place for a new robo-rl OpenVLA checkpoint"):
        p.save_pretrained(".")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    cfg = json.loads((saved / "config.json").read_text())
    stats = cfg["norm_stats"]["robo_rl"]["action"]
    for key in ("q01", "q99", "mask"):
        stats[key] = stats[key][:-1]
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"has \d+-D norm_stats but its model decodes \d+-D actions"):
        OpenVLAPolicy(OpenVLAConfig(checkpoint=str(saved)))
