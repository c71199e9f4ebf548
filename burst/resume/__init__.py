"""Continuing a run elsewhere: the resume that launches, the node side, a run's status."""
