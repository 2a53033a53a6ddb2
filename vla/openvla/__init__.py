"""OpenVLA-style VLA: action tokenizer, model on transformers modules, checkpoint loading, batch decoding."""
