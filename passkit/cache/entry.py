"""Own the bytes of one compile-cache entry: its checksum, its signature and where it came from.

Every store (the folder, the server), ``passkit cache pack`` and ``unpack`` hold entries in this
one format, so checking an entry is the same wherever it was found::

    MAGIC | origin (8) | signer (32) | signature (64) | sha256 of payload (32) | length (8) | payload

- the payload is the pickled entry (``passkit.cache.store``); nothing here unpickles it;
- the signer is an ed25519 public key (zeros: unsigned), and the signature covers the magic, the
  cache key, the payload's digest and its length, so an entry cannot be replayed under another
  key, and a changed byte anywhere in the payload fails the check;
- the origin (``pack`` for an unpacked entry, else blank) says where an entry came from; it is
  a label, outside the signature, so changing it changes only what a report says.

``decode`` checks, in order, the magic, the length, the checksum (a failure is ``CorruptEntry``:
the store deletes the entry) and then, when the process trusts keys, the signature (a failure is
``UntrustedEntry``: kept, since another reader may trust its signer). Only then are the payload's
bytes handed back, so an entry no trusted key signed is never unpickled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from passkit.cache.signing import public_half, public_text

__all__ = ["MAGIC", "CorruptEntry", "UntrustedEntry", "Decoded", "encode", "decode", "with_origin"]

MAGIC = b"passkit-cache-entry v2\n"
_ORIGIN, _SIGNER, _SIGNATURE, _DIGEST, _LENGTH = 8, 32, 64, 32, 8
HEADER = len(MAGIC) + _ORIGIN + _SIGNER + _SIGNATURE + _DIGEST + _LENGTH
UNSIGNED = bytes(_SIGNER)


class CorruptEntry(Exception):
    """An entry that fails its own checks (truncated, altered without a signature, unloadable)."""


class UntrustedEntry(Exception):
    """An intact entry this process must not load: unsigned, signed by a key it does not trust,
    or with a signature that does not match its bytes. The message names the key or the mismatch."""


@dataclass(frozen=True)
class Decoded:
    payload: bytes
    origin: str  # "pack", or "" (the store that returned it says where it was)
    signer: str  # "ed25519:<base64>", or "" when unsigned


def _message(key: str, digest: bytes, length: int) -> bytes:
    return MAGIC + key.encode() + b"\0" + digest + length.to_bytes(_LENGTH, "little")


def encode(key: str, payload: bytes, signer: Any = None, origin: str = "") -> bytes:
    """The entry for ``payload`` under ``key``, signed by ``signer`` (an ed25519 private key) if given."""
    digest = hashlib.sha256(payload).digest()
    public, signature = UNSIGNED, bytes(_SIGNATURE)
    if signer is not None:
        public = public_half(signer)
        signature = signer.sign(_message(key, digest, len(payload)))
    label = origin.encode().ljust(_ORIGIN)[:_ORIGIN]
    return MAGIC + label + public + signature + digest + len(payload).to_bytes(_LENGTH, "little") + payload


def with_origin(blob: bytes, origin: str) -> bytes:
    """``blob`` relabelled as coming from ``origin`` (its signature still holds)."""
    return blob[: len(MAGIC)] + origin.encode().ljust(_ORIGIN)[:_ORIGIN] + blob[len(MAGIC) + _ORIGIN :]


def decode(blob: bytes, key: str, trusted: frozenset[bytes] | None) -> Decoded:
    """Check ``blob`` as the entry for ``key`` and return its payload. With ``trusted`` (the raw
    public keys this process trusts) the entry must carry a valid signature by one of them."""
    if not blob.startswith(MAGIC):
        raise CorruptEntry("not a passkit cache entry")
    if len(blob) < HEADER:
        raise CorruptEntry(f"truncated ({len(blob)} bytes)")
    at = len(MAGIC)
    origin = blob[at : at + _ORIGIN].decode(errors="replace").strip()
    at += _ORIGIN
    signer = blob[at : at + _SIGNER]
    signature = blob[at + _SIGNER : at + _SIGNER + _SIGNATURE]
    at += _SIGNER + _SIGNATURE
    digest, length = blob[at : at + _DIGEST], int.from_bytes(blob[at + _DIGEST : HEADER], "little")
    payload = blob[HEADER:]
    if len(payload) != length:
        raise CorruptEntry(f"truncated ({len(payload)} of {length} bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    named = "" if signer == UNSIGNED else public_text(signer)
    if trusted is not None:
        if signer == UNSIGNED:
            raise UntrustedEntry("unsigned")
        if signer not in trusted:
            raise UntrustedEntry(f"signed by {named}, a key this process does not trust")
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(signer).verify(signature, _message(key, digest, length))
        except InvalidSignature:
            raise UntrustedEntry(f"its signature by {named} does not match its bytes (altered, or stored under another key)") from None
    return Decoded(payload, origin, named)
