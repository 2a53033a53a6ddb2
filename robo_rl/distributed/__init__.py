"""Placement of env workers on devices (and, later, Ray actors wrapping the same plain objects)."""
