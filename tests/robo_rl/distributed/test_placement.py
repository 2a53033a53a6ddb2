from collections import Counter

import pytest

from robo_rl.distributed.placement import Device, describe, egl_device_id, place_env_workers
from robo_rl.errors import ConfigError


def _envs_per_device(placements):
    c = Counter()
    for p in placements:
        c[p.device] += p.envs
    return c


def test_no_gpu_means_cpu():
    out = place_env_workers([1, 1, 1], [])
    assert [p.device for p in out] == [None, None, None]
    assert describe(out) == "cpu: workers [0, 1, 2] (3 envs)"


def test_one_gpu_takes_everything():
    out = place_env_workers([2, 2], [Device(0)])
    assert {p.device for p in out} == {0}


@pytest.mark.parametrize("workers", [1, 3, 5, 8, 13])
def test_eight_gpus_even_within_one(workers):
    devs = [Device(i) for i in range(8)]
    counts = _envs_per_device(place_env_workers([1] * workers, devs))
    per = [counts.get(i, 0) for i in range(8)]
    assert max(per) - min(per) <= 1 and sum(per) == workers


def test_two_gpus_uneven_worker_sizes_balance_envs():
    out = place_env_workers([4, 1, 1, 3, 1], [Device(0), Device(1)])
    counts = _envs_per_device(out)
    assert counts[0] + counts[1] == 10 and abs(counts[0] - counts[1]) <= 4
    assert sorted(counts.values()) == [5, 5]


def test_existing_load_on_learner_gpu_is_avoided():
    out = place_env_workers([1] * 4, [Device(0, load=3.0), Device(1)])
    counts = _envs_per_device(out)
    assert counts[1] == 3 and counts[0] == 1  # loads end at 4 and 3


def test_bad_inputs():
    with pytest.raises(ConfigError, match=">= 1 env"):
        place_env_workers([1, 0], [Device(0)])
    with pytest.raises(ConfigError, match="duplicate"):
        place_env_workers([1], [Device(0), Device(0)])


def test_egl_ids_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert egl_device_id(1) == 5
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert egl_device_id(1) == 1


def test_libero_render_devices_follow_the_placement(monkeypatch):
    import robo_rl.distributed.placement as placement
    from sims.libero.env import LiberoConfig, render_devices

    monkeypatch.setattr(placement, "visible_devices", lambda: [Device(0), Device(1)])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert render_devices(LiberoConfig(num_envs=5, gl="egl")) == [0, 1, 0, 1, 0]
    assert render_devices(LiberoConfig(num_envs=3, gl="osmesa")) == [-1, -1, -1]  # osmesa renders on the CPU
    assert render_devices(LiberoConfig(num_envs=2, gl="egl", render_gpu=1)) == [1, 1]


def test_maniskill_render_backends_follow_the_placement(monkeypatch):
    import robo_rl.distributed.placement as placement
    from sims.maniskill.env import ManiSkillConfig, render_backends

    monkeypatch.setattr(placement, "visible_devices", lambda: [])
    assert render_backends(ManiSkillConfig(num_envs=3)) == ["cpu"] * 3
    monkeypatch.setattr(placement, "visible_devices", lambda: [Device(0), Device(1)])
    assert render_backends(ManiSkillConfig(num_envs=4)) == ["gpu:0", "gpu:1", "gpu:0", "gpu:1"]
    # two envs per worker: a worker's envs share its device
    assert render_backends(ManiSkillConfig(num_envs=5, envs_per_worker=2)) == ["gpu:0", "gpu:0", "gpu:1", "gpu:1", "gpu:0"]
    assert render_backends(ManiSkillConfig(num_envs=2, render_device=1)) == ["gpu:1", "gpu:1"]


def test_cluster_requests_must_fit_on_single_nodes():
    """Totals can suffice while no node holds one actor (2 CPUs asked, two 1-CPU nodes): Ray would
    leave it pending forever, so the check fails first, naming the nodes."""
    from types import SimpleNamespace

    from robo_rl.distributed.cluster import ClusterError, check_resources, pack

    class FakeRay:
        def __init__(self, nodes):
            self._nodes = nodes

        def cluster_resources(self):
            return {"CPU": sum(c for c, _ in self._nodes), "GPU": sum(g for _, g in self._nodes)}

        def nodes(self):
            return [{"Alive": True, "Resources": {"CPU": c, "GPU": g}} for c, g in self._nodes] + \
                [{"Alive": False, "Resources": {"CPU": 64.0}}]

    cc = SimpleNamespace(num_workers=1, cpus_per_worker=2.0, gpus_per_worker=0.0, num_learners=0,
                         cpus_per_learner=1.0, gpus_per_learner=0.0)
    with pytest.raises(ClusterError, match=r"do not fit on the nodes \(1 CPU, 0 GPU\), \(1 CPU, 0 GPU\)"):
        check_resources(FakeRay([(1.0, 0.0), (1.0, 0.0)]), cc)
    check_resources(FakeRay([(2.0, 0.0), (1.0, 0.0)]), cc)
    gpu = SimpleNamespace(num_workers=2, cpus_per_worker=1.0, gpus_per_worker=0.5, num_learners=2,
                          cpus_per_learner=1.0, gpus_per_learner=1.0)
    check_resources(FakeRay([(4.0, 2.0), (4.0, 1.0)]), gpu)  # learners take whole GPUs, workers the halves left
    with pytest.raises(ClusterError, match="need 4 CPUs and 3 GPUs; the cluster has 4 CPUs and 2 GPUs"):
        check_resources(FakeRay([(2.0, 1.0), (2.0, 1.0)]), gpu)
    assert pack([(1.0, 1.0)] * 2 + [(1.0, 0.5)] * 2, [(2.0, 1.5), (2.0, 1.5)])  # 1 + 0.5 GPU per node
    assert not pack([(1.0, 1.0)] * 3, [(2.0, 1.5), (2.0, 1.5)])
    assert pack([(1.0, 1.0)] + [(4.0, 0.0)] * 2, [(8.0, 1.0), (1.0, 1.0)])  # learner on the small GPU node
