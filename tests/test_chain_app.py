"""App unit tests: the ante handler's checks, block headers, the store, and fuzzed decoders."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain.app import App, Limits, TxRejected, verify_signature
from chain.genesis import genesis_state
from chain.node import Node, create_app
from chain.store import Store, StoreError
from protocol.keys import test_wallet
from tests.support.txs import APP_GENESIS, app_send_tx


def _app(**kw: object) -> App:
    return App(genesis_state(APP_GENESIS), min_gas_price=1, **kw)  # type: ignore[arg-type]


def _code(app: App, raw: bytes) -> int:
    with pytest.raises(TxRejected) as info:
        app.check_tx(raw)
    return info.value.code


def test_ante_rejections_have_sdk_codes() -> None:
    app = _app(limits=Limits(max_tx_bytes=2048, max_memo_chars=8))
    assert _code(app, b"") == 2
    assert _code(app, b"\x00" * 4096) == 21
    assert _code(app, app_send_tx(app, memo="x" * 9)) == 12
    assert _code(app, app_send_tx(app, gas=100, fee=100)) == 11
    assert _code(app, app_send_tx(app, fee=1)) == 13
    assert _code(app, app_send_tx(app, gas=20_000_000, fee=20_000_000)) == 41
    assert _code(app, app_send_tx(app, seq=1)) == 32
    assert _code(app, app_send_tx(app, fee=10**19, gas=200_000)) == 5  # cannot pay the fee


def test_tampered_signature_and_high_s_are_refused() -> None:
    app = _app()
    raw = bytearray(app_send_tx(app))
    raw[-1] ^= 1
    assert _code(app, bytes(raw)) == 4
    pub = test_wallet(1).public_key().public_key_bytes
    sig = test_wallet(1).signer().sign(b"m", canonicalise=True)
    assert verify_signature(pub, b"m", sig)
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    high_s = sig[:32] + (n - int.from_bytes(sig[32:], "big")).to_bytes(32, "big")
    assert not verify_signature(pub, b"m", high_s)  # malleated twin of a valid signature


def test_block_header_chains_and_commits_to_state() -> None:
    app = _app()
    b1 = app.deliver_block([app_send_tx(app)], 10**18)
    b2 = app.deliver_block([], 10**18)  # same clock: time still strictly increases
    assert b2.header["prev_block_hash"] == b1.hash
    assert b2.header["time_ns"] > b1.header["time_ns"]
    assert b1.header["app_hash"] != _app().deliver_block([], 10**18).header["app_hash"]
    assert b1.results[0].code == 0 and b1.results[0].gas_used > 0


def test_store_round_trip_and_detects_a_mismatched_snapshot(tmp_path: Path) -> None:
    app = _app()
    store = Store(tmp_path / "db.sqlite")
    store.init_genesis(app.state, APP_GENESIS.model_dump_json())
    raw = app_send_tx(app)
    block = app.deliver_block([raw], 10**18)
    store.commit_block(block, app.state)
    state, header, block_hash = store.load_state()
    assert state.accounts[str(test_wallet(1).address())].sequence == 1
    assert header == block.header and block_hash == block.hash
    got = store.tx(block.results[0].hash.lower())
    assert got is not None and got[0] == raw and got[1].code == 0
    store._db.execute("UPDATE state_rows SET body = replace(body, '\"sequence\":1', '\"sequence\":7')")
    with pytest.raises(StoreError):
        store.load_state()
    store.close()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_decoder_answers_random_bytes_with_a_named_error(data: bytes) -> None:
    app = _app()
    with pytest.raises(TxRejected) as info:
        app.check_tx(data)
    assert info.value.codespace in ("sdk", "diloco") and info.value.log


_VALID = app_send_tx(_app())


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(_VALID) - 1), st.integers(1, 255))
def test_any_single_byte_flip_of_a_signed_tx_is_refused(pos: int, xor: int) -> None:
    app = _app()
    mutated = bytearray(_VALID)
    mutated[pos] ^= xor
    with pytest.raises(TxRejected):
        app.check_tx(bytes(mutated))


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    node = Node(tmp_path_factory.mktemp("n"), APP_GENESIS, log=lambda **_: None)
    with TestClient(create_app(node, run_blocks=False)) as client:
        yield client  # type: ignore[misc]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=300),
        st.dictionaries(st.text(max_size=10), st.text(max_size=40), max_size=4).map(
            lambda d: str(d).encode()
        ),
    )
)
def test_http_bodies_never_crash_the_node(http: TestClient, body: bytes) -> None:
    for path in ("/cosmos/tx/v1beta1/txs", "/cosmos/tx/v1beta1/simulate"):
        r = http.post(path, content=body)
        assert r.status_code in (200, 400), (path, r.status_code, r.text)
    assert http.get("/inference/diloco/v1/status").status_code == 200


def test_http_simulate_gives_the_gas_the_block_charges(http: TestClient) -> None:
    app = _app()
    raw = app_send_tx(app)
    r = http.post("/cosmos/tx/v1beta1/simulate", json={"tx_bytes": base64.b64encode(raw).decode()})
    assert r.status_code == 200
    assert int(r.json()["gas_info"]["gas_used"]) == app.gas_for(len(raw), 1)
