"""A run's software environment: freeze it, record it, rebuild it on another node, check it."""
