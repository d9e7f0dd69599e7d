"""Keys: published BIP-32/BIP-39 vectors, coin type 1200, and an owner-only keyring."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cosmpy.aerial.wallet import LocalWallet

from protocol.keys import (
    HD_PATH,
    TEST_MNEMONIC,
    Keyring,
    KeyringError,
    address_of,
    derive_private_key,
    mnemonic_to_seed,
    new_mnemonic,
    normalize_mnemonic,
    parse_path,
    read_passphrase_file,
    test_wallet,
    wallet_from_mnemonic,
)
from protocol.messages import MsgLeaveRun

BIP32_SEED = bytes.fromhex("000102030405060708090a0b0c0d0e0f")


def test_bip32_vector_1() -> None:
    # BIP-32 test vector 1: master key and chain m/0'/1/2'/2/1000000000.
    assert derive_private_key(BIP32_SEED, "m").hex() == (
        "e8f32e723decf4051aefac8e2c93c9c5b214313817cdb01a1494b917c8436b35"
    )
    assert derive_private_key(BIP32_SEED, "m/0'/1/2'/2/1000000000").hex() == (
        "471b76e389e528d6de6d816857e012c5455051cad6660850e58372a6c3e6e7c8"
    )


def test_bip39_trezor_vector() -> None:
    assert mnemonic_to_seed(TEST_MNEMONIC, "TREZOR").hex() == (
        "c55257c360c07c72029aebc1b53c05ed0362ada38ead3e3e9efa3708e53495531f09a6987599d18264c1e1c92f"
        "2cf141630c7a3c4ab7c81b2f001698e7463b04"
    )


def test_cosmos_path_matches_cosmpy_and_known_address() -> None:
    ours = wallet_from_mnemonic(TEST_MNEMONIC, path="m/44'/118'/0'/0/0")
    theirs = LocalWallet.from_mnemonic(TEST_MNEMONIC, prefix="gonka")
    assert ours.signer().private_key_bytes == theirs.signer().private_key_bytes
    assert str(LocalWallet.from_mnemonic(TEST_MNEMONIC, prefix="cosmos").address()) == (
        "cosmos19rl4cm2hmr8afy4kldpxz3fka4jguq0auqdal4"
    )


def test_gonka_wallet_uses_coin_type_1200() -> None:
    w = wallet_from_mnemonic(TEST_MNEMONIC)
    assert HD_PATH == "m/44'/1200'/0'/0/0"
    assert str(w.address()).startswith("gonka1")
    assert str(w.address()) != str(wallet_from_mnemonic(TEST_MNEMONIC, path="m/44'/118'/0'/0/0").address())
    assert address_of(w.public_key()) == str(w.address())
    assert address_of(w.public_key().public_key_bytes) == str(w.address())
    MsgLeaveRun(creator=str(w.address()), run_id=1)  # the message models accept the address


def test_test_wallets_deterministic_distinct_and_on_hd_path() -> None:
    addrs = [str(test_wallet(i).address()) for i in range(4)]
    assert len(set(addrs)) == 4
    assert addrs[0] == str(test_wallet(0).address())
    assert addrs[0] == str(wallet_from_mnemonic(TEST_MNEMONIC).address())
    assert addrs[2] == str(wallet_from_mnemonic(TEST_MNEMONIC, path="m/44'/1200'/0'/0/2").address())
    with pytest.raises(KeyringError):
        test_wallet(-1)


def test_new_mnemonic_valid_and_fresh() -> None:
    a, b = new_mnemonic(), new_mnemonic()
    assert len(a.split()) == 24 and a != b
    assert normalize_mnemonic(a) == a


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abandon " * 11 + "abandon",  # checksum fails
        " ".join(["abandon"] * 11 + ["zzzz"]),
        " ".join(["abandon"] * 10 + ["about"]),
    ],
)
def test_bad_mnemonics_are_named_errors(bad: str) -> None:
    with pytest.raises(KeyringError):
        wallet_from_mnemonic(bad)


@pytest.mark.parametrize("bad", ["", "x/0", "m/a", "m/0''", "m/2147483648", "44'/0"])
def test_bad_paths(bad: str) -> None:
    with pytest.raises(KeyringError):
        parse_path(bad)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_keyring_add_import_list_show(tmp_path: Path) -> None:
    ring = Keyring(tmp_path / "keys")
    assert mode(tmp_path / "keys") == 0o700
    info, phrase = ring.add("alice")
    assert len(phrase.split()) == 24
    imported, same = ring.add("bob", "  " + TEST_MNEMONIC.upper() + "\n")
    assert same == TEST_MNEMONIC
    assert imported.address == str(test_wallet(0).address())
    assert [k.name for k in ring.list()] == ["alice", "bob"]
    assert ring.show("alice") == info
    assert str(ring.wallet("bob").address()) == imported.address
    assert mode(tmp_path / "keys" / "alice.json") == 0o600
    assert not [p for p in (tmp_path / "keys").iterdir() if p.name.startswith(".tmp")]
    # a second Keyring over the same directory sees the same keys
    assert Keyring(tmp_path / "keys").show("bob") == imported


def test_keyring_errors(tmp_path: Path) -> None:
    ring = Keyring(tmp_path)
    ring.add("k")
    with pytest.raises(KeyringError, match="exists"):
        ring.add("k")
    with pytest.raises(KeyringError, match="no key"):
        ring.wallet("nobody")
    for bad in ("../evil", "a/b", "", "x" * 65):
        with pytest.raises(KeyringError):
            ring.add(bad)
    ring.delete("k")
    assert ring.names() == []


def test_keyring_refuses_readable_files(tmp_path: Path) -> None:
    ring = Keyring(tmp_path)
    ring.add("k")
    os.chmod(tmp_path / "k.json", 0o640)
    with pytest.raises(KeyringError, match="group or others"):
        ring.wallet("k")
    os.chmod(tmp_path / "k.json", 0o600)
    ring.wallet("k")


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"mnemonic": 5}', b"\xff\xfe", b" " * 70_000])
def test_keyring_corrupt_files(tmp_path: Path, content: bytes) -> None:
    ring = Keyring(tmp_path)
    path = tmp_path / "k.json"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(KeyringError):
        ring.wallet("k")


def test_keyring_detects_tampered_address(tmp_path: Path) -> None:
    ring = Keyring(tmp_path)
    ring.add("k", TEST_MNEMONIC)
    path = tmp_path / "k.json"
    path.write_text(path.read_text().replace(str(test_wallet(0).address()), str(test_wallet(1).address())))
    with pytest.raises(KeyringError, match="does not match"):
        ring.wallet("k")


# ---------------------------------------------------------------- encrypted keys (the "file" backend)

FAST_KDF = 1 << 10  # scrypt cost for tests; real keys use SCRYPT_N


def test_encrypted_key_round_trip_and_no_plaintext_on_disk(tmp_path: Path) -> None:
    ring = Keyring(tmp_path, "correct horse", kdf_n=FAST_KDF)
    info, _ = ring.add("sealed", TEST_MNEMONIC, encrypt=True)
    assert info.encrypted and info.address == str(test_wallet(0).address())
    raw = (tmp_path / "sealed.json").read_text()
    assert "abandon" not in raw and "mnemonic" not in raw and info.address in raw
    assert mode(tmp_path / "sealed.json") == 0o600
    # listing and showing need no passphrase; signing does
    bare = Keyring(tmp_path)
    assert bare.show("sealed") == info and [k.name for k in bare.list()] == ["sealed"]
    with pytest.raises(KeyringError, match="is encrypted: give its passphrase"):
        bare.wallet("sealed")
    with pytest.raises(KeyringError, match="wrong passphrase"):
        Keyring(tmp_path, "battery staple").wallet("sealed")
    asked: list[int] = []
    lazy = Keyring(tmp_path, lambda: asked.append(1) or "correct horse")
    assert str(lazy.wallet("sealed").address()) == info.address
    assert str(lazy.wallet("sealed").address()) == info.address and asked == [1]  # asked once


def test_plaintext_and_encrypted_keys_share_a_keyring(tmp_path: Path) -> None:
    Keyring(tmp_path).add("old", TEST_MNEMONIC)  # an existing plaintext keyring keeps working
    ring = Keyring(tmp_path, "passphrase!", kdf_n=FAST_KDF)
    ring.add("new", encrypt=True)
    assert str(Keyring(tmp_path).wallet("old").address()) == str(test_wallet(0).address())
    assert [(k.name, k.encrypted) for k in ring.list()] == [("new", True), ("old", False)]
    ring.encrypt("old")
    assert ring.encrypted("old") and "abandon" not in (tmp_path / "old.json").read_text()
    assert str(ring.wallet("old").address()) == str(test_wallet(0).address())
    with pytest.raises(KeyringError, match="already encrypted"):
        ring.encrypt("old")


def test_encrypted_key_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyringError, match="at least 8 characters"):
        Keyring(tmp_path, "short", kdf_n=FAST_KDF).add("k", encrypt=True)
    assert not (tmp_path / "k.json").exists()
    ring = Keyring(tmp_path, "long enough", kdf_n=FAST_KDF)
    ring.add("k", TEST_MNEMONIC, encrypt=True)
    path = tmp_path / "k.json"
    original = path.read_text()
    # the readable address is authenticated: swapping it breaks the unlock, and `show` sees it
    path.write_text(original.replace(str(test_wallet(0).address()), str(test_wallet(1).address())))
    with pytest.raises(KeyringError, match="does not match its public key"):
        ring.show("k")
    with pytest.raises(KeyringError, match="wrong passphrase"):
        ring.wallet("k")
    # a hostile file cannot make the reader allocate unbounded memory
    path.write_text(original.replace('"n": 1024', '"n": 1073741824'))
    with pytest.raises(KeyringError, match="out of bounds"):
        ring.wallet("k")
    path.write_text(original.replace('"ciphertext": "', '"ciphertext": "zz'))
    with pytest.raises(KeyringError, match="malformed"):
        ring.wallet("k")


def test_passphrase_file(tmp_path: Path) -> None:
    f = tmp_path / "pass"
    f.write_text("secret passphrase\nignored\n")
    os.chmod(f, 0o600)
    assert read_passphrase_file(f) == "secret passphrase"
    os.chmod(f, 0o644)
    with pytest.raises(KeyringError, match="group or others"):
        read_passphrase_file(f)
    with pytest.raises(KeyringError, match="cannot read passphrase file"):
        read_passphrase_file(tmp_path / "missing")


def test_a_node_unlocks_an_encrypted_key_with_its_passphrase_file(tmp_path: Path) -> None:
    """host.toml / verifier.toml: `[key] keyring_dir`, `name` and `passphrase_file` (relative to the TOML)."""
    from trainer.node_config import ConfigError, KeySource

    Keyring(tmp_path / "keys", "node passphrase", kdf_n=FAST_KDF).add("host-0", TEST_MNEMONIC, encrypt=True)
    pw = tmp_path / "pw"
    pw.write_text("node passphrase\n")
    os.chmod(pw, 0o600)
    key = KeySource(keyring_dir="keys", name="host-0", passphrase_file="pw")
    assert str(key.wallet(tmp_path).address()) == str(test_wallet(0).address())
    pw.write_text("not the passphrase\n")
    with pytest.raises(ConfigError, match="wrong passphrase"):
        key.wallet(tmp_path)
    with pytest.raises(ConfigError, match="is encrypted: give its passphrase"):
        KeySource(keyring_dir="keys", name="host-0").wallet(tmp_path)
    with pytest.raises(ValueError, match="passphrase_file unlocks a keyring key"):
        KeySource(test_index=1, passphrase_file="pw")
