"""Adapters that give framework users burst's snapshots, exact data position and failover
without rewriting their loops: :mod:`burst.integrations.lightning` (a callback) and
:mod:`burst.integrations.accelerate` (a loop helper). Each imports its framework only
when used, so burst itself never depends on either."""
