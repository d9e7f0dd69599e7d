"""The parts both nodes are built from (DESIGN §3): a typed view of chain state (`chainview`), one
object policy with exact sizes from the run's model layout (`objects`), one content-addressed
store (`store`), one blob fetcher and server (`blobs`), the global model (`globalmodel`), one
status/metrics board (`board`), and joining/logging (`node`). `trainer/` and `verifier/` import
these; neither imports the other's node code. Imports: protocol and the chain's client only.
"""
