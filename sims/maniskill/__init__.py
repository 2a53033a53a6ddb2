"""ManiSkill3 adapter: CPU physics in spawn workers, or all envs batched on the GPU backend."""
