import numpy as np
import pytest

from robo_rl.errors import ConfigError
from sims.variations import VariationConfig, paraphrase


def test_paraphrase_keeps_objects_and_varies():
    rng = np.random.default_rng(0)
    outs = {paraphrase("pick up the black bowl and place it on the plate", rng) for _ in range(30)}
    assert len(outs) > 3 and all("black bowl" in o and "plate" in o for o in outs)


def test_config_validation():
    assert not VariationConfig().active and VariationConfig(paraphrase=True).active
    with pytest.raises(ConfigError, match="light_scale"):
        VariationConfig(light_scale=(2.0, 1.0))
    with pytest.raises(ConfigError, match=">= 0 metres"):
        VariationConfig(camera_jitter=-1.0)
