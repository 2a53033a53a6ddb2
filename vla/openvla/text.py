"""Text tokenizers for the prompt: a checkpoint's own HF tokenizer, or a byte tokenizer for
random-init models (ids 3..258 are bytes; 0 pad, 1 BOS, 2 EOS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from robo_rl.errors import ConfigError


class PromptTooLong(ConfigError):
    """An instruction tokenizes to more tokens than the prompt budget (never silently truncated)."""


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without BOS/EOS."""
        ...


class ByteTokenizer:
    """UTF-8 bytes shifted by 3; fits any vocabulary with >= 259 ids below the action ids."""

    offset = 3

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]


class HFTokenizer:
    """A transformers tokenizer loaded from a local directory (``tokenizer.json`` / ``tokenizer.model``)."""

    def __init__(self, path: str | Path, gguf_file: str | None = None) -> None:
        from transformers import AutoTokenizer

        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        # trust_remote_code=False: a released config.json's auto_map must never run (or prompt to run) its code
        self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False, **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def save(self, path: str | Path) -> None:
        self.tok.save_pretrained(str(path))


def has_hf_tokenizer(path: Path) -> bool:
    return any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))


def check_prompt(instruction: str, ids: list[int], budget: int) -> list[int]:
    """``ids`` if they fit the prompt budget, else a one-line ``PromptTooLong`` (never truncated)."""
    if len(ids) > budget:
        raise PromptTooLong(f"instruction {instruction!r} needs {len(ids)} prompt tokens but "
                            f"policy.max_prompt_tokens = {budget}; raise it")
    return ids


def batch_instructions(obs: dict[str, Any], batch: int, default: str) -> list[str]:
    """The B instructions of an observation (``default`` where it carries none; one string for all)."""
    instr = obs.get("instruction")
    if instr is None:
        return [default] * batch
    if isinstance(instr, str):
        return [instr] * batch
    if len(instr) != batch:
        raise ValueError(f"obs['instruction'] has {len(instr)} entries for a batch of {batch}")
    return [str(t) for t in instr]
