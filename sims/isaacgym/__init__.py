"""NVIDIA Isaac Gym (Preview) behind the VecEnv contract, for users who have it installed."""
