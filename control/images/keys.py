"""Keys of the store: a per-tenant key that encrypts chunks and manifests at
rest, and the cluster's manifest key that signs manifests (issue 13,
docs/security.md).

Key files hold 32 random bytes, raw or as 64 hex digits (`head -c32
/dev/urandom > key`, or a Kubernetes Secret mounted as a directory: one file
per key of the Secret). They must not be readable by group or others. A key is
read once, kept in memory, and never logged, printed or put in an exception
(`Keyring.__repr__` shows paths only).

Tenant keys: `store.tenant_keys_dir/<tenant id>`. Every derived value is an
HMAC-SHA256 under the tenant key with its own label, so no two uses share a
key:

    chunk key      HMAC(K, "thaw/chunk-key/v1\\0"  || sha256(raw chunk))   AES-256-GCM key
    chunk nonce    HMAC(chunk key, "thaw/chunk-nonce/v1\\0" || sha256(codec || 0 || payload))[:12]
    pointer name   HMAC(K, "thaw/chunk-name/v1\\0" || sha256(raw chunk))   hex: chunks/<name>
    manifest key   HMAC(K, "thaw/manifest-key/v1\\0")                       AES-256-GCM, random nonce
    order key      HMAC(K, "thaw/order-key/v1\\0")                          AES-256-GCM, random nonce

Convergent within a tenant: one tenant's equal chunks encrypt to equal bytes
under equal pointer names, so dedup works there exactly as in plaintext
(it is by pointer name; docs/store.md). Across tenants nothing is shared:
other keys, other prefixes. The nonce depends on the stored payload, not only
the chunk: two encoders that compress one chunk differently (another zlib)
never reuse a (key, nonce) pair with different plaintexts, which would break
GCM. A stored encrypted chunk is `nonce || ciphertext || tag` (28 bytes
more than the payload), authenticated with the chunk's SHA-256 and codec as
associated data. Known limits of convergent encryption (docs/security.md):
whoever holds the tenant key can confirm a guess of a whole chunk's content;
equal chunks of one tenant are visibly equal; sizes and counts are visible.

Manifest key: `store.manifest_key_file`, shared by every node of a cluster.
Manifests carry tag = HMAC(M, "thaw/manifest-tag/v1\\0" || canonical JSON of
everything else) (control/images/manifest.py sign/verify).

Twin: go/internal/fetch/crypt.go OpenSealed (thaw-fetch's pull and
thaw-gofer's stream both call it) opens chunks with the per-chunk keys the plan carries
(SEALED_OVERHEAD, NONCE_BYTES, the associated data).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from control.config import Settings
from control.errors import ConfigError, KeyMissing, PreconditionError

KEY_BYTES = 32
NONCE_BYTES = 12          # twin: go/internal/fetch/crypt.go NonceBytes
TAG_BYTES = 16
SEALED_OVERHEAD = NONCE_BYTES + TAG_BYTES   # twin: go/internal/fetch/crypt.go SealedOverhead
# The name of the encryption in a manifest ("encryption" field); no Go twin: Go reads no
# manifest, the plan gives each sealed chunk its own key.
ENCRYPTION = "aes-256-gcm-convergent-v1"
SEALED_MANIFEST_MAGIC = b"thaw-sealed-manifest-v1\n"
SEALED_ORDER_MAGIC = b"thaw-sealed-order-v1\n"
SEALED_POD_TABLE_MAGIC = b"thaw-sealed-pod-table-v1\n"

_CHUNK_KEY = b"thaw/chunk-key/v1\0"
_CHUNK_NONCE = b"thaw/chunk-nonce/v1\0"
_CHUNK_NAME = b"thaw/chunk-name/v1\0"
_MANIFEST_KEY = b"thaw/manifest-key/v1\0"
_ORDER_KEY = b"thaw/order-key/v1\0"
_POD_TABLE_KEY = b"thaw/pod-table-key/v1\0"
# The HMAC label of a pod table's integrity tag (control/thawd/podtables.py): not a
# manifest's, so neither can pass for the other.
POD_TABLE_TAG_LABEL = b"thaw/pod-table-tag/v1\0"
MANIFEST_TAG_LABEL = b"thaw/manifest-tag/v1\0"


def _hmac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def read_key_file(path: Path, what: str) -> bytes:
    """32 key bytes from `path` (raw, or 64 hex digits); ConfigError naming the file, never the bytes."""
    try:
        st = os.stat(path)
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ConfigError(what, f"cannot read {path}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(what, f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                          "make it 0400 or 0600 (a Kubernetes Secret volume: defaultMode 0400)")
    if len(data) == KEY_BYTES:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise ConfigError(what, f"{path} must hold {KEY_BYTES} random bytes, raw or as {2 * KEY_BYTES} hex digits")


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


# -- chunks ---------------------------------------------------------------------------

def chunk_key(tenant_key: bytes, h: str) -> bytes:
    """The AES-256-GCM key of the chunk whose raw bytes have SHA-256 `h` (hex)."""
    return _hmac(tenant_key, _CHUNK_KEY, bytes.fromhex(h))


def pointer_name(tenant_key: bytes, h: str) -> str:
    """The name under chunks/ of an encrypted tenant's pointer to chunk `h`: the
    bucket's listing shows no chunk's SHA-256."""
    return _hmac(tenant_key, _CHUNK_NAME, bytes.fromhex(h)).hex()


def _aad(h: str, codec: str) -> bytes:
    return bytes.fromhex(h) + codec.encode()


def seal_chunk(key: bytes, h: str, codec: str, payload: bytes) -> bytes:
    """nonce || AES-256-GCM(payload) || tag, deterministic for equal (key, codec, payload)."""
    nonce = _hmac(key, _CHUNK_NONCE, hashlib.sha256(codec.encode() + b"\0" + payload).digest())[:NONCE_BYTES]
    return nonce + AESGCM(key).encrypt(nonce, payload, _aad(h, codec))


def open_chunk(key: bytes, h: str, codec: str, stored: bytes | memoryview) -> bytes:
    """The payload of a sealed chunk; ValueError when it was altered or sealed with another key."""
    if len(stored) < SEALED_OVERHEAD:
        raise ValueError(f"{len(stored)} bytes is shorter than a sealed chunk")
    stored = bytes(stored)
    try:
        return AESGCM(key).decrypt(stored[:NONCE_BYTES], stored[NONCE_BYTES:], _aad(h, codec))
    except InvalidTag:
        raise ValueError("AES-GCM tag does not verify (altered, or sealed with another tenant's key)") from None


# -- manifests ---------------------------------------------------------------------------

def _manifest_aad(tenant: str, key: str, tuple_hash: str) -> bytes:
    return f"{tenant}\0{key}\0{tuple_hash}".encode()


def seal_manifest(tenant_key: bytes, tenant: str, key: str, tuple_hash: str, body: bytes) -> bytes:
    """A manifest as stored for an encrypted tenant: bound to where it is stored."""
    mk = _hmac(tenant_key, _MANIFEST_KEY)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return SEALED_MANIFEST_MAGIC + nonce + AESGCM(mk).encrypt(nonce, body, _manifest_aad(tenant, key, tuple_hash))


def is_sealed_manifest(body: bytes) -> bool:
    return body.startswith(SEALED_MANIFEST_MAGIC)


def open_manifest(tenant_key: bytes, tenant: str, key: str, tuple_hash: str, body: bytes) -> bytes:
    """The JSON of a sealed manifest; ValueError when it does not open for this tenant, key and tuple."""
    rest = body[len(SEALED_MANIFEST_MAGIC):]
    mk = _hmac(tenant_key, _MANIFEST_KEY)
    try:
        return AESGCM(mk).decrypt(rest[:NONCE_BYTES], rest[NONCE_BYTES:], _manifest_aad(tenant, key, tuple_hash))
    except (InvalidTag, ValueError):
        raise ValueError("it does not open with this tenant's key for this key and tuple "
                         "(altered, moved, or sealed by another tenant)") from None


# -- learned orders (issue 18) -----------------------------------------------------------

def seal_order(tenant_key: bytes, tenant: str, key: str, tuple_hash: str, body: bytes) -> bytes:
    """A streamed restore's learned order as stored for an encrypted tenant (the
    ranges of memory its workload faulted on first: they say what it touches),
    bound to where it is stored, as a manifest (control/images/stream.py)."""
    ok = _hmac(tenant_key, _ORDER_KEY)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return SEALED_ORDER_MAGIC + nonce + AESGCM(ok).encrypt(nonce, body, _manifest_aad(tenant, key, tuple_hash))


def open_order(tenant_key: bytes, tenant: str, key: str, tuple_hash: str, body: bytes) -> bytes:
    """The JSON of a sealed order; ValueError when it is not one or does not open here."""
    if not body.startswith(SEALED_ORDER_MAGIC):
        raise ValueError("it is not sealed, but this tenant's images are (store.encrypt)")
    rest = body[len(SEALED_ORDER_MAGIC):]
    ok = _hmac(tenant_key, _ORDER_KEY)
    try:
        return AESGCM(ok).decrypt(rest[:NONCE_BYTES], rest[NONCE_BYTES:], _manifest_aad(tenant, key, tuple_hash))
    except (InvalidTag, ValueError):
        raise ValueError("it does not open with this tenant's key for this key and tuple") from None


# -- pod tables (control/thawd/podtables.py) ----------------------------------------------

def seal_pod_table(tenant_key: bytes, tenant: str, lookup: str, key: str, body: bytes) -> bytes:
    """A pod table as stored for an encrypted tenant (which containers a pod's image
    holds: their images and specs are the tenant's to know), bound to where it is stored."""
    tk = _hmac(tenant_key, _POD_TABLE_KEY)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return SEALED_POD_TABLE_MAGIC + nonce + AESGCM(tk).encrypt(nonce, body, _manifest_aad(tenant, lookup, key))


def open_pod_table(tenant_key: bytes, tenant: str, lookup: str, key: str, body: bytes) -> bytes:
    """The JSON of a sealed pod table; ValueError when it is not one or does not open here."""
    if not body.startswith(SEALED_POD_TABLE_MAGIC):
        raise ValueError("it is not sealed, but this tenant's images are (store.encrypt)")
    rest = body[len(SEALED_POD_TABLE_MAGIC):]
    tk = _hmac(tenant_key, _POD_TABLE_KEY)
    try:
        return AESGCM(tk).decrypt(rest[:NONCE_BYTES], rest[NONCE_BYTES:], _manifest_aad(tenant, lookup, key))
    except (InvalidTag, ValueError):
        raise ValueError("it does not open with this tenant's key for this lookup and key") from None


# -- the keyring --------------------------------------------------------------------------

class Keyring:
    """The node's keys: per-tenant keys (when `encrypt`) and the manifest key."""

    def __init__(self, tenant_keys_dir: Path | None = None, manifest_key_file: Path | None = None,
                 encrypt: bool = False) -> None:
        if encrypt and tenant_keys_dir is None:
            raise ConfigError("store.tenant_keys_dir", "store.encrypt is on but no tenant key directory is set")
        self.tenant_keys_dir = tenant_keys_dir
        self.manifest_key_file = manifest_key_file
        self.encrypt = encrypt
        self._tenant: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._manifest: bytes | None = None
        if manifest_key_file is not None:
            try:
                self._manifest = read_key_file(manifest_key_file, "store.manifest_key_file")
            except FileNotFoundError:
                raise ConfigError("store.manifest_key_file", f"{manifest_key_file} does not exist") from None

    @classmethod
    def from_settings(cls, s: Settings) -> "Keyring":
        return cls(s.store_tenant_keys_dir, s.store_manifest_key_file, s.store_encrypt)

    def __repr__(self) -> str:
        return (f"Keyring(encrypt={self.encrypt}, tenant_keys_dir={self.tenant_keys_dir}, "
                f"manifest_key_file={self.manifest_key_file})")

    @property
    def manifest_key(self) -> bytes | None:
        return self._manifest

    def tenant_key(self, tenant: str) -> bytes | None:
        """The tenant's chunk key when encryption is on (KeyMissing without one), else None.
        Read on first use, so a key added to the directory (a Secret updated) is seen
        without a restart; a key once read is kept."""
        if not self.encrypt:
            return None
        with self._lock:
            k = self._tenant.get(tenant)
        if k is not None:
            return k
        assert self.tenant_keys_dir is not None
        if "/" in tenant or tenant.startswith("."):
            raise PreconditionError(f"tenant {tenant!r} cannot name a key file")
        try:
            k = read_key_file(self.tenant_keys_dir / tenant, "store.tenant_keys_dir")
        except FileNotFoundError:
            raise KeyMissing(tenant, str(self.tenant_keys_dir)) from None
        with self._lock:
            self._tenant[tenant] = k
        return k
