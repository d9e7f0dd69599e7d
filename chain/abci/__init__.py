"""The `inference.diloco` state machine as a CometBFT 0.38 (ABCI 2.0) application.

`wire`: CometBFT's socket framing (uvarint-length-delimited protobuf). `cometbft`: the pinned
engine binary, its configs and local n-validator networks. `validator`: one validator process, the
ABCI app served to a CometBFT child over a socket and the same Cosmos REST routes as the embedded
node, from committed state. `faults`: test-only altered rules (a validator that lies).
"""
