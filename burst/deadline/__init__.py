"""Deadlines: the policy, the backup scheduler, timers that outlive the terminal, time parsing."""
