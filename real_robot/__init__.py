"""real_robot."""
