"""The logged scalars of an update: each term's mean over the minibatches that produced it."""

import torch

from robo_rl.algorithms.optim import TermMeans


def test_a_term_is_averaged_over_the_minibatches_that_have_it():
    logged = TermMeans()
    logged.add({"policy_loss": 1.0, "self_imitation": torch.tensor(0.6)})
    logged.add({"policy_loss": 3.0})
    logged.add({"policy_loss": 5.0, "self_imitation": torch.tensor(0.2)})
    means = logged.means()
    assert means["policy_loss"] == 3.0
    assert abs(means["self_imitation"] - 0.4) < 1e-6  # not 0.8 / 3


def test_tensors_that_carry_gradients_are_read_as_floats():
    w = torch.tensor(2.0, requires_grad=True)
    logged = TermMeans()
    logged.add({"loss": w * 3, "grad_norm": torch.tensor(1.5), "n": 4})
    means = logged.means()
    assert means == {"loss": 6.0, "grad_norm": 1.5, "n": 4.0}
    assert all(type(v) is float for v in means.values())


def test_nothing_recorded_gives_no_terms():
    assert TermMeans().means() == {}
