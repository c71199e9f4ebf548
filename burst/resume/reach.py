"""What a remote node can reach: addresses that only mean something on this machine's network.

A rendered task once carried ``BURST_ENDPOINT_URL: "http://127.0.0.1:39123"`` to a cloud
node: the node's own loopback has no store there, so its setup failed after the GPU was
paid for. Loopback (``127.0.0.0/8``, ``::1``, ``localhost``), link-local (``169.254.0.0/16``,
``fe80::/10``) and private addresses (``10/8``, ``172.16/12``, ``192.168/16``, ``fc00::/7``,
and ``100.64/10``, the carrier-grade NAT range Alibaba's VPC endpoints sit in) name this
machine or its own network, so a store endpoint, a package mirror or a Python mirror given
by such an address is refused for a remote node, in one line, before anything is launched
(a store endpoint stops the resume; a mirror, only ever a fallback, is left out and said).
A node that does share the network (an SSH box on the same LAN, a cluster inside the same
VPC) is allowed explicitly (``burst resume --allow-private-endpoints``); the local stub
runs on this machine and is not remote.

Only literal addresses and ``localhost`` are judged: a name is resolved by the node's own
DNS, which may well answer differently there.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from burst.errors import ConfigError

CARRIER_NAT = ipaddress.ip_network("100.64.0.0/10")
FLAG = "--allow-private-endpoints"


def address_kind(host: str | None) -> str | None:
    """``loopback``, ``link-local`` or ``private`` for such a host; None otherwise."""
    name = (host or "").strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return "loopback"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_private or (address.version == 4 and address in CARRIER_NAT):
        return "private"
    return None


def host_of(url: str) -> str | None:
    try:
        return urlsplit(url if "://" in url else f"//{url}").hostname
    except ValueError:
        return None


def local_only(values: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(name, url, kind)`` for each value (URLs, space-separated) that only this
    machine's network reaches."""
    found = []
    for name, value in values.items():
        for url in str(value).split():
            kind = address_kind(host_of(url))
            if kind is not None:
                found.append((name, url, kind))
    return found


def check_endpoints(values: Mapping[str, str], allowed: bool, dry_run: bool = False
                    ) -> list[str]:
    """Refuse (or, when ``allowed``, warn about) store addresses a remote node cannot
    reach; a dry run only warns (it launches nothing)."""
    found = local_only(values)
    if not found:
        return []
    if allowed:
        return [f"{n}={u} is a {k} address: forwarded because of {FLAG} (the node must share "
                "this network)" for n, u, k in found]
    name, url, kind = found[0]
    problem = (f"{name}={url} is a {kind} address, which a remote node cannot reach: give "
               f"the node an address it can reach, or pass {FLAG} for a node inside that "
               "network")
    if dry_run:
        return [problem]
    raise ConfigError(problem)


def drop_mirrors(mirrors: dict[str, str], allowed: bool) -> list[str]:
    """Leave out (in place) the mirrors a remote node cannot reach, saying so: a mirror
    is only a fallback, so a local one (a devpi on this machine) costs the node nothing
    but is never sent where it means nothing; ``allowed`` forwards them."""
    found = local_only(mirrors)
    if allowed or not found:
        return []
    for name, url, _kind in found:
        kept = [u for u in mirrors[name].split() if u != url]
        if kept:
            mirrors[name] = " ".join(kept)
        else:
            mirrors.pop(name, None)
    return [f"not forwarded to the node: {n}={u} is a {k} address it cannot reach ({FLAG} "
            "forwards it)" for n, u, k in found]
