"""A logic-only fake of ``isaacgym.gymapi`` (the calls IsaacGymVecEnv makes) and a toy task."""

from __future__ import annotations

import types

import torch

CALLS: list[str] = []


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class SimParams:
    def __init__(self) -> None:
        self.dt, self.substeps, self.up_axis, self.gravity = 0.0, 0, None, None
        self.use_gpu_pipeline = False
        self.physx = _Obj(use_gpu=False)


class Gym:
    def create_sim(self, compute_device, graphics_device, type, params):
        CALLS.append("create_sim")
        return _Obj(device=compute_device, t=0)

    def prepare_sim(self, sim):
        return True

    def simulate(self, sim):
        sim.t += 1

    def fetch_results(self, sim, wait):
        assert wait is True

    def destroy_sim(self, sim):
        CALLS.append("destroy_sim")


def make_module() -> tuple[types.ModuleType, types.ModuleType]:
    gymapi = types.ModuleType("isaacgym.gymapi")
    gymapi.acquire_gym = lambda: Gym()
    gymapi.SimParams = SimParams
    gymapi.Vec3 = lambda x, y, z: (x, y, z)
    gymapi.SIM_PHYSX = "physx"
    gymapi.UP_AXIS_Z = "z"
    pkg = types.ModuleType("isaacgym")
    pkg.gymapi = gymapi
    return pkg, gymapi


class CounterTask:
    """obs = [steps since reset, env id]; env i terminates (success) when its action > 0.5."""

    num_obs, num_actions, max_episode_steps = 2, 1, 3

    def create_envs(self, gym, sim, num_envs):
        self.n = num_envs
        self.t = torch.zeros(num_envs)
        self.last = torch.zeros(num_envs, 1)
        self.resets = []

    def apply_actions(self, gym, sim, actions):
        self.last = actions.clone()

    def compute(self, gym, sim):
        self.t += 1
        hit = self.last[:, 0] > 0.5
        return self.observe(gym, sim), self.t.clone(), hit, hit

    def reset_envs(self, gym, sim, env_ids, seed):
        self.resets.append(env_ids.tolist())
        self.t[env_ids] = 0

    def observe(self, gym, sim):
        return torch.stack([self.t, torch.arange(self.n, dtype=torch.float32)], dim=1)
