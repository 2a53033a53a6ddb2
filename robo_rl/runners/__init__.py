"""Train / evaluate loops: wire env + policy + algorithm + logging + checkpoints."""
