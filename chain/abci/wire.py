"""CometBFT's ABCI socket framing: each message is its protobuf bytes after an unsigned varint
length (`protoio.NewDelimitedWriter`, `binary.PutUvarint` in CometBFT 0.38's libs/protoio).

Requests arrive in order on each connection and are answered in the same order, one response
per request; a `flush` request asks for the buffered responses to be written.
"""

from __future__ import annotations

import asyncio

from cosmpy.protos.tendermint.abci.types_pb2 import Request, Response
from google.protobuf.message import DecodeError

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""A FinalizeBlock carries a whole block (≤ 16 MiB of txs by the consensus params): room to spare,
and a bound on what a corrupt or hostile peer on the socket can make the app allocate."""
MAX_VARINT_BYTES = 10


class FramingError(ValueError):
    """Bytes on the ABCI socket that are not a well-formed, size-bounded message."""


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("uvarint of a negative number")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def frame(message: Response | Request) -> bytes:
    body = message.SerializeToString()
    return encode_varint(len(body)) + body


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the connection, None at a clean EOF; raises `FramingError`."""
    length = shift = 0
    for i in range(MAX_VARINT_BYTES + 1):
        if i == MAX_VARINT_BYTES:
            raise FramingError("length prefix longer than 10 bytes")
        chunk = await reader.read(1)
        if not chunk:
            if i == 0:
                return None
            raise FramingError("connection closed inside a length prefix")
        byte = chunk[0]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    if length > MAX_MESSAGE_BYTES:
        raise FramingError(f"message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FramingError("connection closed inside a message") from None
    return parse_request(body)


def parse_request(body: bytes) -> Request:
    request = Request()
    try:
        request.ParseFromString(body)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise FramingError(f"undecodable ABCI request: {exc}") from None
    if request.WhichOneof("value") is None:
        raise FramingError("ABCI request with no value")
    return request
