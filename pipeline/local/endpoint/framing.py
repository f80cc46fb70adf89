"""A request body read off the connection as HTTP/1.1 frames it (RFC 9112, section 6): `Content-Length` or
`chunked`, within the real-time payload limit and a deadline.

Every framing error is an `EndpointError` with a 4xx status; after one the stream position is unknown, so the
connection must close (`FramingError.keep_alive` is False), except for an oversized body that was read away.
"""

from __future__ import annotations

import re
import socket
import time
from email.message import Message
from typing import BinaryIO

from pipeline.local.endpoint.handler import EndpointError
from steps.contract import MAX_PAYLOAD_BYTES

DRAIN_LIMIT = 64 * 1024 * 1024  # an oversized body up to this size is read and dropped, beyond it left unread
MAX_LINE = 65536  # a chunk-size or trailer line, as http.server limits header lines
MAX_TRAILERS = 100
_DIGITS = re.compile(r"[0-9]+")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(;.*)?")


class FramingError(EndpointError):
    """A request whose body cannot be read as framed; `keep_alive`: the connection may serve another request."""

    def __init__(self, status: int, code: str, message: str, keep_alive: bool = False) -> None:
        super().__init__(status, code, message)
        self.keep_alive = keep_alive


def _too_large(size: str, keep_alive: bool = False) -> FramingError:
    return FramingError(413, "ValidationError", f"Request body{size} is over the {MAX_PAYLOAD_BYTES} bytes limit "
                        "of real-time inference.", keep_alive)


class _Stream:
    """Reads from `rfile` (over `connection`) with one deadline for the whole body."""

    def __init__(self, rfile: BinaryIO, connection: socket.socket, timeout: float) -> None:
        self.rfile, self.connection, self.timeout = rfile, connection, timeout
        self.deadline = time.monotonic() + timeout

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.connection.settimeout(left)

    def read(self, size: int) -> bytes:
        """Exactly `size` bytes; a 400 when the client ends the body early."""
        parts, got = [], 0
        while got < size:
            self._arm()
            part = self.rfile.read1(min(size - got, 1 << 20))
            if not part:
                raise FramingError(400, "ValidationError", f"the request body ended after {got} of {size} bytes")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def line(self) -> bytes:
        """One CRLF-ended line of the chunked framing, without its end."""
        self._arm()
        line = self.rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise FramingError(400, "ValidationError", "a chunked body line is too long or the body ended early")
        return line.rstrip(b"\r\n")


def _content_length(headers: Message) -> int | None:
    values = {v.strip() for value in headers.get_all("Content-Length", []) for v in value.split(",")}
    if not values:
        return None
    if len(values) > 1 or not _DIGITS.fullmatch(next(iter(values))):
        shown = ", ".join(sorted(values))
        raise FramingError(400, "ValidationError", f"invalid Content-Length {shown!r}: expected one number of bytes")
    return int(values.pop())


def _chunked(stream: _Stream) -> bytes:
    """The chunks' data; a body over the limit is read away up to DRAIN_LIMIT (as a Content-Length one), so that
    the client, still sending, gets the 413 and the connection serves on."""
    chunks, total = [], 0
    while True:
        match = _CHUNK_SIZE.fullmatch(stream.line())
        if not match:
            raise FramingError(400, "ValidationError", "invalid chunk size line: expected hexadecimal digits")
        size = int(match[1], 16)
        if size == 0:
            break
        total += size
        if total > DRAIN_LIMIT:
            raise _too_large("")
        data = stream.read(size)
        if total <= MAX_PAYLOAD_BYTES:
            chunks.append(data)
        if stream.line():
            raise FramingError(400, "ValidationError", "a chunk is longer than its size line says")
    for _ in range(MAX_TRAILERS):
        if not stream.line():
            if total > MAX_PAYLOAD_BYTES:
                raise _too_large(f" of {total} bytes", keep_alive=True)
            return b"".join(chunks)
    raise FramingError(400, "ValidationError", f"more than {MAX_TRAILERS} trailer lines")


def read_body(rfile: BinaryIO, connection: socket.socket, headers: Message, timeout: float) -> bytes:
    """The body of the request whose `headers` were just read; it must arrive within `timeout` seconds."""
    stream = _Stream(rfile, connection, timeout)
    idle = connection.gettimeout()
    try:
        coding = headers.get("Transfer-Encoding")
        if coding is not None:
            if coding.strip().lower() != "chunked":
                raise FramingError(400, "ValidationError", f"Transfer-Encoding {coding!r}: only chunked is supported")
            return _chunked(stream)
        length = _content_length(headers)
        if length is None:
            raise FramingError(411, "LengthRequired", "a POST needs a Content-Length header (or chunked encoding)")
        if length > MAX_PAYLOAD_BYTES:
            if length > DRAIN_LIMIT:
                raise _too_large(f" of {length} bytes")
            stream.read(length)  # read it away, so that a client still sending gets the answer
            raise _too_large(f" of {length} bytes", keep_alive=True)
        return stream.read(length)
    except TimeoutError as exc:
        raise FramingError(408, "RequestTimeout", f"the request body did not arrive within {timeout:g} s") from exc
    except ConnectionError as exc:
        raise FramingError(400, "ValidationError", f"the connection broke in the request body: {exc}") from exc
    finally:
        connection.settimeout(idle)
