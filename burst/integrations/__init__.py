"""Adapters that give framework users burst's snapshots, exact data position and failover
without rewriting their loops: :mod:`burst.integrations.lightning` (a callback),
:mod:`burst.integrations.accelerate` (a loop helper) and
:mod:`burst.integrations.transformers` (a Hugging Face ``Trainer`` mixin and callback,
for TRL's trainers and PEFT models too). Each imports its framework only when used, so
burst itself never depends on any of them."""
