"""A process that pre-stages a synthetic wheelhouse to an S3 store, for the test that
SIGKILLs it mid-way (tests/env/test_staging.py). It records every object it writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from burst.env import stageparts, throttle, wheelhouse
from burst.env.stager import Stager
from burst.store import open_store
from tests.helpers.staging_helpers import house_of, small_lock

TARGET = wheelhouse.Target("3.11", policy="all")


class Recording:
    """The store, with the key of every write it is asked for."""

    WRITES = ("put", "put_file", "put_if_absent", "put_checked")

    def __init__(self, store) -> None:
        self.store, self.puts = store, []

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if name not in self.WRITES:
            return attr

        def write(key, *args, **kwargs):
            self.puts.append(key)
            return attr(key, *args, **kwargs)

        return write


def main(args: dict) -> None:
    store = Recording(open_store(args["url"], endpoint_url=args["endpoint"],
                                 addressing_style="path"))
    paths = [Path(p) for p in args["wheels"]]
    house = house_of(paths, TARGET)
    lock = small_lock("a")
    context = stageparts.Context("run", lambda: lock, Path.cwd(), target=TARGET,
                                 build=lambda _lock, _target: house)
    fixed, _ = throttle.parse_rate(args["rate"])
    bucket = throttle.TokenBucket(lambda: fixed, paused=lambda: False)
    stager = Stager(store, "run", stageparts.wheel_parts(context), bucket=bucket)
    done = stager.run_once()
    Path(args["out"]).write_text(json.dumps({"puts": store.puts, "ready": done.ready}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
