"""Snapshots: the format, the RAM/disk tiers, reading, retention, and moving them between stores."""
