"""Where this machine's wheel cache lies (``~/.cache/burst/wheels``, ``$BURST_WHEEL_CACHE``).

The wheelhouse (:mod:`burst.env.wheelhouse.cache`) keeps downloaded and built wheels
there between freezes, and the background stager reads them from there while the run
trains; the inputs' selection (:mod:`burst.inputs.selection`) must know the place too, so
that those reads never count as the run's inputs. Both ask here, below both of them.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "BURST_WHEEL_CACHE"


def cache_dir() -> Path:
    """Where downloaded and built wheels are kept between freezes."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "burst" / "wheels")
