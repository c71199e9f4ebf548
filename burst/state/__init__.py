"""Training state in and out of snapshots: capture and restore, the tree encoding, random generators."""
