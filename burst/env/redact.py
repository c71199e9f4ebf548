"""Keeping credentials out of everything burst writes.

Two kinds of secret reach burst by accident: credentials embedded in URLs (a package index
``https://user:token@mirror/simple``, a git remote ``https://oauth2:glpat-...@gitlab``) and
secret files sitting in a project directory (``.env``, SSH keys, cloud credentials). URLs
are reduced to scheme, host, port and path before they are recorded; secret files are never
read into a code archive. Environment variable *values* are never recorded at all, so this
module has nothing to say about them.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import PurePosixPath
from urllib.parse import urlsplit, urlunsplit

# File names (matched against the last path component, case-insensitively) that hold
# credentials by convention. A file matching any of these is never put in a code archive.
SECRET_NAMES = (
    ".env", ".env.*", "*.env", ".envrc",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "*.gpg", "*.asc",
    "id_*", "*_rsa", "*_dsa", "*_ecdsa", "*_ed25519",
    ".netrc", "_netrc", ".pypirc", ".npmrc", ".yarnrc", ".git-credentials", ".pgpass",
    ".htpasswd", ".dockercfg", "credentials", "*credentials*.json", "*credentials*.csv",
    "credentials.y*ml", "credentials.toml", "credentials.ini", "secrets.json", "secrets.y*ml",
    "secrets.toml", "secrets.ini", "service-account*.json", "*-sa-key.json",
    "client_secret*.json",
    ".boto", ".s3cfg", ".ossutilconfig", ".vault-token", "kubeconfig", "*.kubeconfig",
)
# Directories whose whole content is credentials or keys.
SECRET_DIRS = (".git", ".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config/gcloud")
# A whole PEM private key (header, key material, matching footer), not merely the marker
# text, so code that parses keys is still archived.
_PRIVATE_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY( BLOCK)?-----\r?\n"
                          rb"[A-Za-z0-9+/=:,\- \r\n]{16,}?-----END \1PRIVATE KEY")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def strip_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to record, still usable as an
    index or remote address (the new node brings its own credentials)."""
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if not parts.scheme or not parts.netloc:
        return _strip_scp_like(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _strip_scp_like(url: str) -> str:
    """``user@host:path`` (git's scp syntax): the user name is not a secret, a password is."""
    match = re.match(r"^([^@/:]+)(:[^@/]*)?@([^:/]+):(.*)$", url)
    if match:
        return f"{match.group(1)}@{match.group(3)}:{match.group(4)}"
    return url


def scrub_text(text: str) -> str:
    """Every URL inside ``text`` stripped: for error messages that may quote a remote."""
    return _URL_IN_TEXT.sub(lambda m: strip_url(m.group(0)), text)


def is_secret_path(relpath: str) -> bool:
    """True if the file at ``relpath`` (POSIX, relative to the project root) must never be
    captured: a secret file name, or anything under a secret directory."""
    path = PurePosixPath(relpath)
    lowered = [part.lower() for part in path.parts]
    joined = "/".join(lowered)
    for secret_dir in SECRET_DIRS:
        if secret_dir in lowered[:-1] or f"/{secret_dir}/" in f"/{joined}":
            return True
    name = lowered[-1] if lowered else ""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_NAMES)


def holds_private_key(data: bytes) -> bool:
    """True if ``data`` contains a PEM private key block, whatever the file is called."""
    return _PRIVATE_KEY.search(data) is not None
