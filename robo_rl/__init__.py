"""robo_rl."""
