"""Rollout storage, collection and episode statistics."""
