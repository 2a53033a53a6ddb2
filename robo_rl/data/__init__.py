"""Demonstration datasets: robo-rl's episode format and readers of other formats."""
