"""The preflight: would a burst work right now? (``burst check``, and before each
scheduled backup.)

One module per thing a burst needs: :mod:`~burst.preflight.store` (write, read,
conditional write, delete), :mod:`~burst.preflight.credentials` (expiry),
:mod:`~burst.preflight.environment` (lockfile and wheelhouse),
:mod:`~burst.preflight.clouds` (SkyPilot), :mod:`~burst.preflight.ssh` (SSH targets),
:mod:`~burst.preflight.placement` (the planner) and :mod:`~burst.preflight.disk`;
:mod:`~burst.preflight.check` puts them together and says which rows are required, and
:mod:`~burst.preflight.table` is the answer's shape. Importing this package loads none of
them.
"""
