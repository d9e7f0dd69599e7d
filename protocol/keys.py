"""Gonka accounts: secp256k1 keys, bech32 prefix `gonka`, BIP-39 mnemonics, HD coin type 1200.

cosmpy's `LocalWallet.from_mnemonic` hard-codes the Cosmos path m/44'/118'/0'/0/0 (and its path
parser accepts at most three digits per index), so the BIP-32 walk is done here with cosmpy's
own primitives (secp256k1 key, curve order) over hmac/hashlib. The keyring holds one JSON file
per key that only its owner can read: either the mnemonic in plain text (the Cosmos SDK "test"
backend) or, in the spirit of the SDK's "file" backend, the mnemonic sealed with AES-256-GCM under a
key stretched from a passphrase by scrypt (address, public key and HD path stay readable and are
authenticated with it), so `keys list` needs no passphrase and a stolen file needs one.
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
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

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
PASSPHRASE_ENV = "GONKA_KEYRING_PASSPHRASE"
"""Environment variable holding the keyring passphrase (non-interactive use; a file is safer)."""
MIN_PASSPHRASE = 8
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 15, 8, 1
"""scrypt cost of new encrypted keys: 32 MiB and ≈ 0.1-0.5 s per unlock on this project's CPUs."""
_MAX_SCRYPT_N, _MAX_SCRYPT_R, _MAX_SCRYPT_P = 1 << 20, 32, 16
"""Bounds on the cost a key file may ask for when read (a hostile file must not exhaust memory)."""
_MAX_PASSPHRASE_FILE = 4096


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
    encrypted: bool = False


Passphrase = str | Callable[[], str] | None
"""A passphrase, or a function asked for one only when an encrypted key is used (a prompt)."""


def read_passphrase_file(path: str | os.PathLike[str]) -> str:
    """A passphrase file's first line, refused if others can read it (like a key file)."""
    p = Path(path)
    try:
        st = p.stat()
        if st.st_mode & 0o077:
            raise KeyringError(
                f"passphrase file {p} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o});"
                " chmod 600 it"
            )
        raw = p.read_bytes()[: _MAX_PASSPHRASE_FILE + 1]
    except OSError as exc:
        raise KeyringError(f"cannot read passphrase file {p}: {exc.strerror or exc}") from None
    if len(raw) > _MAX_PASSPHRASE_FILE:
        raise KeyringError(f"passphrase file {p} is larger than {_MAX_PASSPHRASE_FILE} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise KeyringError(f"passphrase file {p} is not UTF-8 text") from None
    lines = text.splitlines()
    return lines[0] if lines else ""


def _seal(mnemonic: str, passphrase: str, aad: bytes, n: int) -> dict[str, Any]:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    salt, nonce = os.urandom(16), os.urandom(12)
    key = Scrypt(salt=salt, length=32, n=n, r=SCRYPT_R, p=SCRYPT_P).derive(passphrase.encode())
    sealed = AESGCM(key).encrypt(nonce, mnemonic.encode(), aad)
    return {
        "cipher": "aes-256-gcm",
        "kdf": "scrypt",
        "kdfparams": {"n": n, "r": SCRYPT_R, "p": SCRYPT_P, "salt": salt.hex()},
        "nonce": nonce.hex(),
        "ciphertext": sealed.hex(),
    }


def _open_sealed(crypto: Any, passphrase: str, aad: bytes, where: str) -> str:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    try:
        if crypto.get("cipher") != "aes-256-gcm" or crypto.get("kdf") != "scrypt":
            raise KeyringError(f"{where}: unsupported cipher or kdf")
        kp = crypto["kdfparams"]
        n, r, p = int(kp["n"]), int(kp["r"]), int(kp["p"])
        salt, nonce = bytes.fromhex(kp["salt"]), bytes.fromhex(crypto["nonce"])
        sealed = bytes.fromhex(crypto["ciphertext"])
    except (AttributeError, KeyError, TypeError, ValueError):
        raise KeyringError(f"{where}: malformed encrypted key") from None
    power_of_two = n > 1 and n & (n - 1) == 0
    if not (power_of_two and n <= _MAX_SCRYPT_N and 0 < r <= _MAX_SCRYPT_R and 0 < p <= _MAX_SCRYPT_P):
        raise KeyringError(f"{where}: scrypt parameters out of bounds (n={n}, r={r}, p={p})")
    if len(salt) < 8 or len(nonce) != 12:
        raise KeyringError(f"{where}: malformed encrypted key")
    key = Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(passphrase.encode())
    try:
        return AESGCM(key).decrypt(nonce, sealed, aad).decode()
    except (InvalidTag, UnicodeDecodeError):
        raise KeyringError(f"{where}: wrong passphrase (or the file was altered)") from None


class Keyring:
    """One JSON file per key under a 0700 directory, each written atomically with mode 0600.

    `passphrase` unlocks encrypted keys (a string, or a function called only when one is needed);
    plaintext keys need none, so one directory may hold both kinds."""

    def __init__(
        self, directory: str | os.PathLike[str], passphrase: Passphrase = None, *, kdf_n: int = SCRYPT_N
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._passphrase = passphrase
        self._kdf_n = kdf_n

    def passphrase(self, name: str) -> str:
        """The passphrase for key `name`, asking the callable once; a clear error when none is given."""
        given = self._passphrase() if callable(self._passphrase) else self._passphrase
        if not given:
            raise KeyringError(
                f"key {name!r} is encrypted: give its passphrase (a prompt on a terminal, "
                f"--passphrase-file F, {PASSPHRASE_ENV}, or [key] passphrase_file in a node's TOML)"
            )
        self._passphrase = given
        return given

    def _path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise KeyringError(f"key name must match {_NAME.pattern}, got {name!r}")
        return self.dir / f"{name}.json"

    def add(self, name: str, mnemonic: str | None = None, *, encrypt: bool = False) -> tuple[KeyInfo, str]:
        """Create (or import) key `name`; returns its info and the mnemonic to write down. With
        `encrypt` the mnemonic is sealed under the keyring's passphrase (at least 8 characters)."""
        path = self._path(name)
        if path.exists():
            raise KeyringError(f"key {name!r} already exists")
        phrase = normalize_mnemonic(mnemonic) if mnemonic is not None else new_mnemonic()
        wallet = wallet_from_mnemonic(phrase)
        _write_private(path, json.dumps(self._record(name, wallet, phrase, encrypt), indent=1).encode())
        return self._info(name, wallet, encrypt), phrase

    def encrypt(self, name: str) -> KeyInfo:
        """Seal an existing plaintext key under the keyring's passphrase (atomically rewritten)."""
        record = self._read(name)
        if "crypto" in record:
            raise KeyringError(f"key {name!r} is already encrypted")
        wallet = self.wallet(name)
        data = self._record(name, wallet, record["mnemonic"], True)
        _write_private(self._path(name), json.dumps(data, indent=1).encode())
        return self._info(name, wallet, True)

    def _record(self, name: str, wallet: LocalWallet, phrase: str, encrypt: bool) -> dict[str, Any]:
        address = str(wallet.address())
        record: dict[str, Any] = {"name": name, "address": address, "hd_path": HD_PATH}
        if not encrypt:
            return {**record, "mnemonic": phrase}
        passphrase = self.passphrase(name)
        if len(passphrase) < MIN_PASSPHRASE:
            raise KeyringError(f"a keyring passphrase has at least {MIN_PASSPHRASE} characters")
        pub = wallet.public_key().public_key_bytes.hex()
        record["public_key"] = pub
        record["crypto"] = _seal(phrase, passphrase, _aad(address, pub, HD_PATH), self._kdf_n)
        return record

    def encrypted(self, name: str) -> bool:
        return "crypto" in self._read(name)

    def resolve(self, name_or_address: str) -> str:
        """A `gonka1…` address as given (checked), else the address of the key of that name."""
        if name_or_address.startswith(PREFIX + "1"):
            try:
                if str(Address(name_or_address, prefix=PREFIX)) == name_or_address:
                    return name_or_address
            except (RuntimeError, ValueError):
                pass
            raise KeyringError(f"{name_or_address!r} is not a valid {PREFIX} address")
        if not (self.dir / f"{name_or_address}.json").exists() and _NAME.match(name_or_address):
            raise KeyringError(
                f"no key named {name_or_address!r} in {self.dir} "
                f"(create it with `gonka-diloco keys add {name_or_address}`)"
            )
        return self.show(name_or_address).address

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json") if _NAME.match(p.stem))

    def list(self) -> list[KeyInfo]:
        return [self.show(n) for n in self.names()]

    def show(self, name: str) -> KeyInfo:
        """Address and public key; an encrypted key's come from its file (no passphrase needed),
        checked against each other, and again against the mnemonic whenever it is unlocked."""
        record = self._read(name)
        if "crypto" not in record:
            return self._info(name, self.wallet(name))
        address, pub = record.get("address"), record.get("public_key")
        try:
            derived = address_of(bytes.fromhex(pub)) if isinstance(pub, str) else None
        except ValueError:
            derived = None
        if derived is None or derived != address:
            raise KeyringError(f"key file {name!r}: address does not match its public key")
        return KeyInfo(name, str(address), str(pub), str(record.get("hd_path", HD_PATH)), True)

    def wallet(self, name: str) -> LocalWallet:
        record = self._read(name)
        path = record.get("hd_path", HD_PATH)
        if "crypto" in record:
            aad = _aad(str(record.get("address")), str(record.get("public_key")), str(path))
            mnemonic = _open_sealed(record["crypto"], self.passphrase(name), aad, f"key {name!r}")
        else:
            mnemonic = record["mnemonic"]
        try:
            wallet = wallet_from_mnemonic(mnemonic, path=path)
        except KeyringError as exc:
            raise KeyringError(f"key file {name!r}: {exc}") from None
        if str(wallet.address()) != record.get("address"):
            raise KeyringError(f"key file {name!r}: address does not match its mnemonic")
        return wallet

    def delete(self, name: str) -> None:
        path = self._path(name)
        if not path.exists():
            raise KeyringError(f"no key named {name!r}")
        path.unlink()

    def _info(self, name: str, wallet: LocalWallet, encrypted: bool = False) -> KeyInfo:
        pub = wallet.public_key().public_key_bytes.hex()
        return KeyInfo(name, str(wallet.address()), pub, HD_PATH, encrypted)

    def _read(self, name: str) -> dict:
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise KeyringError(f"no key named {name!r} in {self.dir}") from None
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
        if not isinstance(record, dict) or not (
            isinstance(record.get("mnemonic"), str) or isinstance(record.get("crypto"), dict)
        ):
            raise KeyringError(f"key file {path} has no mnemonic")
        return record


def _aad(address: str, public_key: str, hd_path: str) -> bytes:
    """What an encrypted key authenticates beside its mnemonic: the fields left readable."""
    return f"gonka-keyring-v1\n{address}\n{public_key}\n{hd_path}".encode()


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
