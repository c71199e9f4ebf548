"""Is each SSH target reachable, with a host key known_hosts vouches for?

Logged into exactly as the ``ssh`` launcher logs in (its own connect path: the SSH config,
its ``ProxyJump`` bastions or ``ProxyCommand``, known_hosts checked, an unknown host
refused), then closed. Nothing is run on the box and no host key is ever accepted: a
preflight that trusted a new key would defeat the check it exists for.
"""

from __future__ import annotations

from burst.errors import BurstError
from burst.launch.ssh import SSHLauncher, Target
from burst.preflight.table import FAIL, OK, Row


def ssh_row(target: Target) -> Row:
    """One row for a parsed target (``Target.parse`` refuses a malformed URL first)."""
    name = f"ssh {target.label}"
    launcher = SSHLauncher(target, accept_new_host=False)
    try:
        launcher.connect()
    except BurstError as error:
        return Row(name, FAIL, str(error), _fix(str(error), target))
    finally:
        launcher.close()
    via = ", ".join(hop.label for hop in target.jumps)
    how = f" through {via}" if via else (" through its ProxyCommand" if target.proxy_command
                                         else "")
    return Row(name, OK, f"logged in as {target.label}{how}; host key known")


def _fix(message: str, target: Target) -> str:
    file = target.known_hosts[0] if target.known_hosts else "~/.ssh/known_hosts"
    host = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
    if "does NOT match" in message:
        return (f"if the box was reinstalled, check its new key with its owner, then "
                f"`ssh-keygen -R '{host}' -f {file}` and add the new one; "
                "otherwise do not connect")
    if "not in known_hosts" in message:
        return (f"check the key's fingerprint, then `ssh-keyscan -p {target.port} "
                f"{target.host} >> {file}` (or burst resume --accept-new-host)")
    return "check the address, port, user and key (--identity), that sshd runs there, " \
           "and the bastion (ProxyJump) if one is needed"
