"""The bucket's own region, for the node: asked at resume time, forwarded in the task.

boto3 on this machine follows an S3 bucket to its region by itself (it retries a request
that AWS answers with the bucket's region), so a store configured for ``us-east-1``, or
for no region at all, works here whatever region the bucket is in. The node's bootstrap
is a hand-written signer that signs for the region it is given (it corrects itself once,
when an error names the region, but a refusal costs a round trip per source and a 301
from a wrong regional endpoint names no way back). So ``burst resume`` asks S3 where the
bucket lives (:func:`burst.store.s3.bucket_region`) and the task carries that region.
"""

from __future__ import annotations

from typing import Any

from burst.store.s3 import S3Store, bucket_region
from burst.store.settings import OPTIONS


def forward(store: Any, envs: dict[str, str]) -> list[str]:
    """Set the task's region to the bucket's own (an ``s3://`` store whose endpoint says
    it); a warning when that corrects the store's region setting."""
    if not isinstance(store, S3Store) or store.scheme != "s3":
        return []  # OSS: the region is the endpoint's, set by the user
    found = bucket_region(store)
    if found is None:
        return []
    name = OPTIONS["region"]
    given = envs.get(name)
    envs[name] = found
    if given and given != found:
        return [f"the bucket {store.bucket} is in {found}, not {given} (the store's region "
                f"setting): the node signs for {found}"]
    return []
