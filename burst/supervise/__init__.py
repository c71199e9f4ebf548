"""Supervising a training process: the agent, GPU watching, fault injection."""
