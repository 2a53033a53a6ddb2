"""sims."""
