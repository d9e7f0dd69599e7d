"""Gonka accounts: secp256k1 keys, bech32 prefix `gonka`, BIP-39 mnemonics, HD coin type 1200.

cosmpy's `LocalWallet.from_mnemonic` hard-codes the Cosmos path m/44'/118'/0'/0/0 (and its path
parser accepts at most three digits per index), so the BIP-32 walk is done here with cosmpy's
own primitives (secp256k1 key, curve order) over hmac/hashlib. The keyring is the equivalent of
the Cosmos SDK "test" backend: mnemonics in plain JSON files that only their owner can read.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cosmpy.aerial.wallet import LocalWallet
from cosmpy.crypto.address import Address
from cosmpy.crypto.keypairs import PrivateKey, PublicKey
from cosmpy.mnemonic import ENGLISH_MNEMONIC_WORDS_LIST, generate_mnemonic

PREFIX = "gonka"
COIN_TYPE = 1200
HD_PATH = f"m/44'/{COIN_TYPE}'/0'/0/0"
TEST_MNEMONIC = " ".join(["abandon"] * 11 + ["about"])
"""The public BIP-39 test mnemonic: devnet and test keys only, never real funds."""

_HARDENED = 1 << 31
_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141  # secp256k1 order
_WORD_INDEX = {w: i for i, w in enumerate(ENGLISH_MNEMONIC_WORDS_LIST)}
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_KEY_FILE = 64 * 1024


class KeyringError(ValueError):
    """Bad mnemonic, bad HD path, unsafe file permissions, unknown or duplicate key name."""


# ---- BIP-39 / BIP-32 ---------------------------------------------------------------------------


def new_mnemonic() -> str:
    """A fresh 24-word mnemonic (256 bits of OS entropy)."""
    return generate_mnemonic(256)


def normalize_mnemonic(mnemonic: str) -> str:
    """Single-spaced lower-case words, after checking word list and BIP-39 checksum."""
    words = mnemonic.lower().split()
    if len(words) not in (12, 15, 18, 21, 24):
        raise KeyringError(f"a mnemonic has 12, 15, 18, 21 or 24 words, got {len(words)}")
    try:
        bits = "".join(format(_WORD_INDEX[w], "011b") for w in words)
    except KeyError as exc:
        raise KeyringError(f"not a BIP-39 English word: {exc.args[0]!r}") from None
    n_check = len(bits) // 33
    entropy = int(bits[:-n_check], 2).to_bytes((len(bits) - n_check) // 8, "big")
    expected = format(hashlib.sha256(entropy).digest()[0], "08b")[:n_check]
    if bits[-n_check:] != expected:
        raise KeyringError("mnemonic checksum mismatch (a word is wrong or out of order)")
    return " ".join(words)


def mnemonic_to_seed(mnemonic: str, passphrase: str = "") -> bytes:
    """BIP-39 seed: PBKDF2-HMAC-SHA512, 2048 rounds, salt "mnemonic" + passphrase."""
    phrase = normalize_mnemonic(mnemonic)
    return hashlib.pbkdf2_hmac("sha512", phrase.encode(), b"mnemonic" + passphrase.encode(), 2048)


def parse_path(path: str) -> list[int]:
    """"m/44'/1200'/0'/0/0" → indexes, hardened ones with bit 31 set."""
    parts = path.split("/")
    if parts[0] != "m" or not all(re.fullmatch(r"\d{1,10}'?", p) for p in parts[1:]):
        raise KeyringError(f"bad HD path {path!r}")
    out = []
    for p in parts[1:]:
        index = int(p.rstrip("'"))
        if index >= _HARDENED:
            raise KeyringError(f"HD index {index} out of range in {path!r}")
        out.append(index | _HARDENED if p.endswith("'") else index)
    return out


def derive_private_key(seed: bytes, path: str = HD_PATH) -> bytes:
    """BIP-32 private derivation from a seed along `path` (32-byte secp256k1 secret)."""
    digest = hmac.digest(b"Bitcoin seed", seed, "sha512")
    key, chain = digest[:32], digest[32:]
    for index in parse_path(path):
        if index & _HARDENED:
            data = b"\x00" + key + index.to_bytes(4, "big")
        else:
            data = PrivateKey(key).public_key.public_key_bytes + index.to_bytes(4, "big")
        digest = hmac.digest(chain, data, "sha512")
        il = int.from_bytes(digest[:32], "big")
        child = (il + int.from_bytes(key, "big")) % _N
        if il >= _N or child == 0:  # probability ~2^-127; BIP-32 says skip this index
            raise KeyringError(f"invalid child key at index {index}; use the next index")
        key, chain = child.to_bytes(32, "big"), digest[32:]
    return key


def wallet_from_mnemonic(mnemonic: str, passphrase: str = "", path: str = HD_PATH) -> LocalWallet:
    """The Gonka wallet of a mnemonic (coin type 1200, prefix `gonka`)."""
    key = derive_private_key(mnemonic_to_seed(mnemonic, passphrase), path)
    return LocalWallet(PrivateKey(key), prefix=PREFIX)


def address_of(public_key: PublicKey | bytes) -> str:
    """bech32 `gonka1…` address of a compressed secp256k1 public key."""
    pk = public_key if isinstance(public_key, PublicKey) else PublicKey(bytes(public_key))
    return str(Address(pk, prefix=PREFIX))


@lru_cache(maxsize=1)
def _test_seed() -> bytes:
    return mnemonic_to_seed(TEST_MNEMONIC)


@lru_cache(maxsize=256)
def _test_key(index: int) -> bytes:
    return derive_private_key(_test_seed(), f"m/44'/{COIN_TYPE}'/0'/0/{index}")


def test_wallet(index: int) -> LocalWallet:
    """Deterministic devnet/test account `index` of TEST_MNEMONIC; index 0 is the authority."""
    if not isinstance(index, int) or not 0 <= index < _HARDENED:
        raise KeyringError(f"test wallet index must be in [0, 2^31), got {index!r}")
    return LocalWallet(PrivateKey(_test_key(index)), prefix=PREFIX)


test_wallet.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported


# ---- keyring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyInfo:
    name: str
    address: str
    public_key: str  # compressed, hex
    hd_path: str


class Keyring:
    """One JSON file per key under a 0700 directory, each written atomically with mode 0600."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)

    def _path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise KeyringError(f"key name must match {_NAME.pattern}, got {name!r}")
        return self.dir / f"{name}.json"

    def add(self, name: str, mnemonic: str | None = None) -> tuple[KeyInfo, str]:
        """Create (or import) key `name`; returns its info and the mnemonic to write down."""
        path = self._path(name)
        if path.exists():
            raise KeyringError(f"key {name!r} already exists")
        phrase = normalize_mnemonic(mnemonic) if mnemonic is not None else new_mnemonic()
        wallet = wallet_from_mnemonic(phrase)
        record = {"name": name, "address": str(wallet.address()), "mnemonic": phrase, "hd_path": HD_PATH}
        _write_private(path, json.dumps(record, indent=1).encode())
        return self._info(name, wallet), phrase

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json") if _NAME.match(p.stem))

    def list(self) -> list[KeyInfo]:
        return [self.show(n) for n in self.names()]

    def show(self, name: str) -> KeyInfo:
        return self._info(name, self.wallet(name))

    def wallet(self, name: str) -> LocalWallet:
        record = self._read(name)
        wallet = wallet_from_mnemonic(record["mnemonic"], path=record.get("hd_path", HD_PATH))
        if str(wallet.address()) != record.get("address"):
            raise KeyringError(f"key file {name!r}: address does not match its mnemonic")
        return wallet

    def delete(self, name: str) -> None:
        path = self._path(name)
        if not path.exists():
            raise KeyringError(f"no key named {name!r}")
        path.unlink()

    def _info(self, name: str, wallet: LocalWallet) -> KeyInfo:
        pub = wallet.public_key().public_key_bytes.hex()
        return KeyInfo(name=name, address=str(wallet.address()), public_key=pub, hd_path=HD_PATH)

    def _read(self, name: str) -> dict:
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise KeyringError(f"no key named {name!r}") from None
        except OSError as exc:
            raise KeyringError(f"cannot open key file {path}: {exc}") from exc
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise KeyringError(f"key file {path} is not a regular file")
            if st.st_mode & 0o077:
                raise KeyringError(
                    f"key file {path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o});"
                    " chmod 600 it"
                )
            raw = f.read(_MAX_KEY_FILE + 1)
        if len(raw) > _MAX_KEY_FILE:
            raise KeyringError(f"key file {path} is too large")
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise KeyringError(f"key file {path} is not valid JSON") from exc
        if not isinstance(record, dict) or not isinstance(record.get("mnemonic"), str):
            raise KeyringError(f"key file {path} has no mnemonic")
        return record


def _write_private(path: Path, data: bytes) -> None:
    """temp file (0600, same dir) + fsync + rename: a crash leaves the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
