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
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
# A URL in prose: a scheme, a colon and at least one slash (so "http:/user:pw@host", a
# malformed URL, is one too), up to whitespace or a quote, bracket or backtick around it.
_URL_IN_TEXT = re.compile(rf"(?<![A-Za-z0-9+.-]){_SCHEME}:/+[^\s'\"<>`]+")
_URL_SHAPE = re.compile(rf"^({_SCHEME}):(/+)([^/?#]*)([^?#]*)")
# "user:password@" outside a URL ("user:pw@host:1", "http:user:pw@host"): the run of
# characters before the "@", from its start to its first colon, is all that is kept.
_USERINFO = re.compile(r"(?<![^\s'\"<>`/@=,;(\[{])([^\s'\"<>`/@:]+):[^\s'\"<>`/@]*@")
# Query-string or "name=value" secrets: presigned-URL signatures, tokens, passwords.
_SECRET_PARAM = re.compile(
    r"(?i)(?<![\w.-])([\w.-]*(?:signature|token|passw(?:or)?d|secret|credentials?|"
    r"api[_-]?key|access[_-]?key|private[_-]?key|security[_-]?token)|sig|pwd|auth)"
    r"=(?!\*\*\*)[^\s&'\"<>`;,)]+")
_KEEP_USER = r"\1@"
_PLACEHOLDER = re.compile(r"^\[[A-Za-z_-]*$")  # "[user" of "[user@]host", in usage texts
_TRAILING = ".,;:!?"
_CLOSERS = {")": "(", "]": "[", "}": "{"}


def strip_url(url: str) -> str:
    """``url`` without user info, query or fragment: safe to record, still usable as an
    index or remote address (the new node brings its own credentials).

    Text, not a parser, does the work, so a malformed URL (``http://[::1``, a port of
    99999, ``http:/user:pw@host``) loses its secrets and keeps everything else as typed:
    the user recognises what they wrote in an error message."""
    url = url.strip()
    match = _URL_SHAPE.match(url)
    if not match:
        return _USERINFO.sub(_KEEP_USER, _strip_scp_like(url))
    scheme, slashes, authority, path = match.groups()
    user, at, host = authority.rpartition("@")
    if at and _PLACEHOLDER.match(user) and host.startswith("]"):
        host = authority  # "ssh://[user@]host[:port]" in a help text: nothing to hide
    return f"{scheme}:{slashes}{host}{_USERINFO.sub(_KEEP_USER, path)}"


def _strip_scp_like(url: str) -> str:
    """``user@host:path`` (git's scp syntax): the user name is not a secret, a password is."""
    match = re.match(r"^([^@/:]+)(:[^@/]*)?@([^:/]+):(.*)$", url)
    if match:
        return f"{match.group(1)}@{match.group(3)}:{match.group(4)}"
    return url


def scrub_text(text: str) -> str:
    """``text`` with every URL stripped (:func:`strip_url`), every other ``user:pw@`` cut
    to ``user@`` and every secret-named parameter (``X-Amz-Signature=``, ``token=``,
    ``password=``...) masked: for messages, logs and echoed command lines."""
    text = _URL_IN_TEXT.sub(_strip_in_text, text)
    text = _USERINFO.sub(_KEEP_USER, text)
    return _SECRET_PARAM.sub(r"\1=***", text)


def _strip_in_text(match: re.Match[str]) -> str:
    """One URL found in prose, less the punctuation that ends its sentence or bracket."""
    url = match.group(0)
    tail = ""
    while url and (url[-1] in _TRAILING or
                   (url[-1] in _CLOSERS and url.count(url[-1]) > url.count(_CLOSERS[url[-1]]))):
        url, tail = url[:-1], url[-1] + tail
    return strip_url(url) + tail


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
