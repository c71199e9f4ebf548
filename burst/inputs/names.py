"""What crosses a process boundary about inputs: environment variables, store prefixes and
the reasons an input is not shipped, spelled once (the training process writes them into
the inputs manifest, ``burst resume`` and the node read them back)."""

from __future__ import annotations

INPUTS_ENV = "BURST_INPUTS"  # a JSON list of paths: ``burst run --input`` to the Run
MAX_BYTES_ENV = "BURST_INPUTS_MAX_BYTES"  # the largest input burst ships (bytes, or 20GB)
RECORD_ENV = "BURST_INPUTS_RECORD"  # "0": do not record the files the run opens
HUB_ENV = "BURST_HUB"  # "ship" (default): hub caches travel; "mirror": the node uses the mirror
MAP_ENV = "BURST_INPUTS_MAP"  # on a node: the JSON file saying where each input was placed
INPUT_ENV_PREFIX = "BURST_INPUT_"  # one variable per input on a node: BURST_INPUT_DATA=...
SHARED_PREFIX = "inputs"  # the store's shared area for input chunks (SHARED_PREFIXES)
CONFIG_SECTION = "inputs"  # [inputs] in the user's config file

# why an input is not shipped; the first three make ``burst resume`` refuse the run
UNREADABLE = "unreadable"
DEVICE = "a device, FIFO or socket, not a file"
OVER_LIMIT = "over the size limit"
IN_CODE = "inside the code archive already"
MIRROR = "in a hub cache; the node uses the hub mirror instead"
EXCLUDED = "excluded by [inputs] exclude"
SECRET = "a secret (credentials, keys): never shipped"
REFUSED = (UNREADABLE, DEVICE, OVER_LIMIT)
