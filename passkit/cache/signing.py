"""Own the compile cache's keys: making an ed25519 key pair, reading the signing key and the
trusted public keys the environment names, and how a public key is written and shown.

- ``passkit cache keygen DIR`` (``keygen``) writes ``passkit-cache.key`` (the private key, PEM
  PKCS#8, mode 0600) and ``passkit-cache.pub`` (one line: ``ed25519:<base64 of the 32 bytes>``);
- ``PASSKIT_CACHE_SIGNING_KEY=FILE`` (``signing_key``): this process signs every entry it writes;
- ``PASSKIT_CACHE_TRUSTED_KEYS=FILE[:FILE...]`` (``trusted_keys``): this process loads only
  entries one of these public keys signed. Without it, entries from the local folder are loaded
  as before (it is the user's own) and the server is written but never read.

Signing key and trust are separate on purpose, as in Nix: a builder may sign what it does not
read back, and a reader holds only public keys, so a compromised reader cannot forge entries.
A key file that cannot be read or parsed is a ``PasskitError`` naming the variable and file.
"""

from __future__ import annotations

import base64
import functools
import os
from pathlib import Path
from typing import Any

from passkit.errors import PasskitError

__all__ = [
    "SIGNING_KEY_ENV",
    "TRUSTED_KEYS_ENV",
    "PRIVATE_NAME",
    "PUBLIC_NAME",
    "keygen",
    "public_text",
    "public_half",
    "require_cryptography",
    "signing_key",
    "trusted_keys",
]

SIGNING_KEY_ENV = "PASSKIT_CACHE_SIGNING_KEY"
TRUSTED_KEYS_ENV = "PASSKIT_CACHE_TRUSTED_KEYS"
PRIVATE_NAME = "passkit-cache.key"
PUBLIC_NAME = "passkit-cache.pub"
PREFIX = "ed25519:"


def require_cryptography(variable: str) -> None:
    """Raise a one-line ``PasskitError`` when the ``cryptography`` package is missing."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise PasskitError(f"{variable} needs the 'cryptography' package (pip install 'passkit[cluster]')") from None


def public_text(raw: bytes) -> str:
    """How a public key is written and named in messages: ``ed25519:<base64>``."""
    return PREFIX + base64.b64encode(raw).decode()


def keygen(folder: Path) -> tuple[Path, Path]:
    """Write a new key pair into ``folder`` (created if missing); refuse to overwrite one."""
    require_cryptography("passkit cache keygen")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = Path(folder)
    private, public = folder / PRIVATE_NAME, folder / PUBLIC_NAME
    for path in (private, public):
        if path.exists():
            raise PasskitError(f"{path} already exists; passkit does not overwrite a key (remove it first)")
    folder.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public.write_text(public_text(public_half(key)) + "\n")
    return private, public


def public_half(key: Any) -> bytes:
    """The raw 32 bytes of a private key's public half."""
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@functools.lru_cache(maxsize=8)
def _read_signing_key(path: str):  # noqa: ANN202 - an Ed25519PrivateKey, imported lazily
    require_cryptography(SIGNING_KEY_ENV)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise PasskitError(f"{SIGNING_KEY_ENV}: cannot read the ed25519 private key {path} ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PasskitError(f"{SIGNING_KEY_ENV}: {path} is not an ed25519 private key (make one with 'passkit cache keygen DIR')")
    return key


def signing_key():  # noqa: ANN201 - an Ed25519PrivateKey or None
    """The key named by ``PASSKIT_CACHE_SIGNING_KEY``, or None when it is unset."""
    path = os.environ.get(SIGNING_KEY_ENV, "").strip()
    return _read_signing_key(str(Path(path).expanduser())) if path else None


def _parse_public(path: Path) -> bytes:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise PasskitError(f"{TRUSTED_KEYS_ENV}: cannot read {path} ({exc.strerror or exc})") from None
    raw = b""
    if text.startswith(PREFIX):
        try:
            raw = base64.b64decode(text[len(PREFIX):], validate=True)
        except ValueError:
            raw = b""
    if len(raw) != 32:
        raise PasskitError(f"{TRUSTED_KEYS_ENV}: {path} is not a passkit public key (expected one line 'ed25519:<base64>', "
                           f"as 'passkit cache keygen' writes)")
    return raw


@functools.lru_cache(maxsize=8)
def _read_trusted(paths: str) -> frozenset[bytes]:
    if paths:
        require_cryptography(TRUSTED_KEYS_ENV)
    return frozenset(_parse_public(Path(part).expanduser()) for part in paths.split(os.pathsep) if part.strip())


def trusted_keys() -> frozenset[bytes]:
    """The raw public keys named by ``PASSKIT_CACHE_TRUSTED_KEYS`` (empty when it is unset)."""
    return _read_trusted(os.environ.get(TRUSTED_KEYS_ENV, "").strip())
