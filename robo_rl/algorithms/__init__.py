"""Learning algorithms: math only, no I/O."""
