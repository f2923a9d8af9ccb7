"""The cryptographic primitives of secure aggregation, all from maintained libraries.

- Key agreement: X25519 (``cryptography``), the shared secret stretched by HKDF-SHA256 into
  a 32-byte key, one key per purpose (``info`` says which), so a mask key never encrypts.
- Authenticated encryption of the secret shares between two sites through the server:
  AES-256-GCM (``cryptography``), the session and both sites' names as associated data, so
  the server can neither read, alter nor replay a share into another session or pair.
- Threshold secret sharing: Shamir t-of-n from Flower (``flwr.common.secure_aggregation``,
  over pycryptodome's ``Shamir`` in GF(2^128), 16-byte chunks).
- Commitments: SHA-256 (``cryptography``) of each Shamir share, bound to its session, owner,
  holder and kind, and of each self-mask seed: the owner publishes them when it shares, so the
  server rejects, by name, a share that does not match (a flipped byte, a garbled or truncated
  share) before it combines anything, and checks a rebuilt seed. They hide nothing weaker than
  the shares: every share carries at least 128 unknown bits to anyone holding fewer than the
  threshold of its siblings, and the seed 256.
- Masks: the ChaCha20 keystream (``cryptography``) of a 32-byte seed, read as uint64 words:
  uniform over Z_{2^64}. Flower's ``pseudo_rand_gen`` is not used: it folds the seed into 32
  bits for NumPy's Mersenne Twister (2^32 seeds to try; predictable) and its
  ``randint(0, range − 1)`` never draws the top value, so its masks are not uniform.

Nothing here invents cryptography: it only names inputs and lengths.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
NONCE_BYTES = 12
MASK_INFO = b"fed-auc secure aggregation: pairwise mask"
SHARE_INFO = b"fed-auc secure aggregation: share encryption"
COMMIT_INFO = b"fed-auc secure aggregation: commitment"
DIGEST_BYTES = 32
# A Shamir share of a KEY_BYTES secret: a 4-byte index, then 16 bytes per chunk of the secret
# padded to whole 16-byte chunks (PKCS#7 adds a full chunk to a whole number of them).
SHARE_BYTES = 4 + 16 * (KEY_BYTES // 16 + 1)


def private_key(secret: bytes) -> X25519PrivateKey:
    """The X25519 key of 32 secret bytes (drawn by the caller, so tests can seed them)."""
    return X25519PrivateKey.from_private_bytes(secret)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def shared_key(own: X25519PrivateKey, other_public: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 of the X25519 secret of ``own`` and ``other_public``: both sides of a pair
    get the same 32 bytes, nobody else can."""
    secret = own.exchange(X25519PublicKey.from_public_bytes(other_public))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def encrypt(key: bytes, nonce: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM; the nonce travels in front of the ciphertext."""
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, message: bytes, associated: bytes) -> bytes:
    """Inverse of ``encrypt``; raises ``cryptography.exceptions.InvalidTag`` if tampered."""
    return AESGCM(key).decrypt(message[:NONCE_BYTES], message[NONCE_BYTES:], associated)


def split_secret(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """Shamir shares 1..count of ``secret``; any ``threshold`` of them give it back."""
    from flwr.common.secure_aggregation.crypto.shamir import create_shares

    return create_shares(secret, threshold, count)


def combine_secret(shares: list[bytes]) -> bytes:
    """The secret of ``threshold`` or more shares of ``split_secret``."""
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares

    return combine_shares(shares)


def commitment(*parts: bytes | str) -> bytes:
    """SHA-256 of ``parts`` (each length-prefixed, so no two lists of parts collide)."""
    digest = hashes.Hash(hashes.SHA256())
    for part in (COMMIT_INFO, *parts):
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.finalize()


def share_commitment(session: str, owner: str, holder: str, kind: str, share: bytes) -> bytes:
    """What ``owner`` publishes for its ``kind`` ("seed" or "key") share held by ``holder``."""
    return commitment(session, owner, holder, kind, share)


def seed_commitment(session: str, owner: str, seed: bytes) -> bytes:
    """What ``owner`` publishes for its self-mask seed: a rebuilt seed must match it."""
    return commitment(session, owner, "self-mask seed", seed)


def mask(seed: bytes, length: int, dtype: np.dtype | type = np.uint64) -> np.ndarray:
    """``length`` unsigned words (``dtype``: uint64 or uint32) of the ChaCha20 keystream of
    ``seed`` (32 bytes)."""
    dtype = np.dtype(dtype)
    cipher = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    stream = cipher.update(b"\0" * (dtype.itemsize * length))
    return np.frombuffer(stream, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
