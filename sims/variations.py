"""Per-env variations for generalization studies, selected by config.

Each simulator applies what it exposes; the evaluation benchmarks build vision (camera, lighting),
semantic (instruction paraphrases) and execution (object initial poses) out-of-distribution splits on
top. All draws come from a generator seeded by the env's episode seed, so a split is reproducible.
Everything at its default leaves the env exactly as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from robo_rl.config import check_ranges, ranged
from robo_rl.errors import ConfigError


@dataclass(frozen=True)
class VariationConfig:
    """What to vary at every reset (all off by default)."""

    camera_jitter: float = ranged(0.0, ge=0, unit="metres")
    """Uniform +- offset of the main camera position (metres). Range: >= 0 metres."""
    camera_offset: tuple[float, float, float] = ranged((0.0, 0.0, 0.0))
    """Fixed xyz shift of the main camera position, the same every episode (metres): a systematic
    out-of-distribution view, added to any jitter. Range: any finite numbers."""
    light_scale: tuple[float, float] = ranged((1.0, 1.0), ge=0)
    """Scene light intensity multiplied by U(low, high), low <= high. Range: each >= 0."""
    retexture: float = ranged(0.0, ge=0, le=1, what="a probability")
    """Probability per episode that the table and floor textures are replaced by random plain colours.
    Range: in [0, 1]."""
    object_recolor: float = ranged(0.0, ge=0, le=1, what="a probability")
    """Probability per episode that the task's movable objects take a random colour unseen in training.
    Range: in [0, 1]."""
    distractors: int = ranged(0, ge=0)
    """Small coloured boxes scattered on the table each episode (ManiSkill tabletop tasks). Range: >= 0."""
    object_pose_jitter: float = ranged(0.0, ge=0, unit="metres")
    """Uniform +- xy offset of movable objects' initial positions (metres). Range: >= 0 metres."""
    object_pose_offset: tuple[float, float] = ranged((0.0, 0.0))
    """Fixed xy shift of movable objects' initial positions, the same every episode (metres), added to
    any jitter. Range: any finite numbers."""
    offset_prob: float = ranged(1.0, ge=0, le=1, what="a probability")
    """Probability per episode that the fixed ``camera_offset`` and ``object_pose_offset`` apply (1 = every
    episode; e.g. 0.5 mixes in-distribution and shifted episodes). Drawn from its own stream of the
    episode seed (``offset_applies``), so the other draws and which episodes are shifted do not depend on
    each other. Range: in [0, 1]."""
    paraphrase: bool = False
    """Replace the instruction with a paraphrase (verb synonyms, reordered politeness)."""
    perturb_step: int = ranged(20, ge=0)
    """Control step of each episode at which movable objects are displaced (with perturb_distance > 0).
    Range: >= 0."""
    perturb_distance: float = ranged(0.0, ge=0, unit="metres")
    """Uniform +- xy displacement of movable objects at perturb_step, a mid-episode push (metres; 0 = off).
    Range: >= 0 metres."""

    def __post_init__(self) -> None:
        check_ranges(self, "env.variations")
        lengths = (("camera_offset", self.camera_offset, 3), ("light_scale", self.light_scale, 2),
                   ("object_pose_offset", self.object_pose_offset, 2))
        for key, value, n in lengths:
            if len(value) != n:
                raise ConfigError(f"config key 'env.variations.{key}' = {list(value)} needs {n} numbers")
        lo, hi = self.light_scale
        if not lo <= hi:
            raise ConfigError(f"config key 'env.variations.light_scale' = {list(self.light_scale)} needs "
                              f"0 <= low <= high")

    @property
    def active(self) -> bool:
        return self != VariationConfig()

    @property
    def distractors_only(self) -> bool:
        """Only ``distractors`` set: a different scene, built into every env (GPU batches too), no per-reset draw."""
        return self.active and VariationConfig(distractors=self.distractors) == self

    def offset_applies(self, *episode_key: int) -> bool:
        """Whether the fixed offsets apply in the episode keyed by ``episode_key`` (the simulator's
        episode seed words): always with ``offset_prob`` 1, else a draw of probability ``offset_prob``."""
        if self.offset_prob >= 1.0:
            return True
        return bool(np.random.default_rng([*episode_key, 3571]).random() < self.offset_prob)

    def scaled(self, strength: float) -> VariationConfig:
        """The same variations at ``strength`` times their size (0 = none, 1 = as configured): jitters
        and offsets scale, the light range shrinks or grows about 1, paraphrasing stays on for any strength > 0."""
        if strength < 0:
            raise ConfigError(f"variation strength {strength} must be >= 0")
        lo, hi = self.light_scale
        return VariationConfig(camera_jitter=self.camera_jitter * strength,
                               camera_offset=tuple(x * strength for x in self.camera_offset),
                               object_pose_offset=tuple(x * strength for x in self.object_pose_offset),
                               retexture=min(1.0, self.retexture * strength),
                               object_recolor=min(1.0, self.object_recolor * strength), distractors=round(self.distractors * strength),
                               light_scale=(max(0.0, 1 - (1 - lo) * strength), 1 + (hi - 1) * strength),
                               object_pose_jitter=self.object_pose_jitter * strength, offset_prob=self.offset_prob,
                               paraphrase=self.paraphrase and strength > 0, perturb_step=self.perturb_step,
                               perturb_distance=self.perturb_distance * strength)


_SYNONYMS = [
    (r"\bpick up\b", ["grab", "lift", "pick up"]),
    (r"\bput\b", ["place", "set", "put"]),
    (r"\bplace\b", ["put", "set", "place"]),
    (r"\bopen\b", ["pull open", "open"]),
    (r"\bclose\b", ["shut", "close"]),
    (r"\bturn on\b", ["switch on", "turn on"]),
    (r"\bpush\b", ["shove", "push"]),
]
_FRAMES = ["{}", "please {}", "{}, please", "can you {}?", "your task: {}"]


def paraphrase(instruction: str, rng: np.random.Generator) -> str:
    """A meaning-preserving rewrite: verb synonyms plus a politeness frame."""
    text = instruction.strip()
    for pattern, choices in _SYNONYMS:
        if re.search(pattern, text):
            text = re.sub(pattern, choices[int(rng.integers(len(choices)))], text, count=1)
            break
    return _FRAMES[int(rng.integers(len(_FRAMES)))].format(text)
