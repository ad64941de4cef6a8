"""One gzip stream made of text compressed as it comes and pieces compressed beforehand (built days,
master.timeline.days), spliced in as they are: a single gzip member, which every reader reads.

A piece is raw deflate from a compressor of its own, ended by a flush that leaves it byte-aligned and
unfinished, so it refers to nothing before it; the stream's own compressor flushes fully before each
piece (forgetting what it had seen), so nothing after a piece refers across it. The trailer's CRC-32
of the whole text comes from each piece's own CRC and length (crc32_combine), not from its text.
"""

import struct
import zlib
from dataclasses import dataclass

_POLY = 0xEDB88320  # CRC-32's polynomial, reflected
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # gzip, deflate, no name, no time, unknown OS


@dataclass(frozen=True)
class Packed:
    """A piece: `body` is the raw deflate of a text of `size` bytes (UTF-8) whose CRC-32 is `crc`."""

    body: bytes
    crc: int
    size: int

    def text(self) -> str:
        return zlib.decompressobj(-15).decompress(self.body).decode()


def pack(text: str, level: int = 9) -> Packed:
    data = text.encode()
    packer = zlib.compressobj(level, zlib.DEFLATED, -15)
    return Packed(packer.compress(data) + packer.flush(zlib.Z_SYNC_FLUSH), zlib.crc32(data), len(data))


def _times(a: int, b: int) -> int:
    """a * b modulo CRC-32's polynomial, in its reflected bit order (x^0 is the top bit)."""
    product, bit = 0, 1 << 31
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


# x^(2^n) modulo the polynomial, for n = 0..63: appending k zero bytes multiplies a CRC by x^(8k).
_X_POW2 = [1 << 30]
for _ in range(63):
    _X_POW2.append(_times(_X_POW2[-1], _X_POW2[-1]))


def crc32_combine(crc1: int, crc2: int, size2: int) -> int:
    """The CRC-32 of a + b from crc1 = crc(a), crc2 = crc(b) and b's length in bytes."""
    shift, n, k = 1 << 31, size2, 3  # x^0; 2^3 bits a byte
    while n:
        if n & 1:
            shift = _times(_X_POW2[k], shift)
        n >>= 1
        k += 1
    return _times(shift, crc1) ^ crc2


class Joiner:
    """Builds the gzip stream: `text()` and `piece()` return the bytes ready to send, `finish()` the rest."""

    def __init__(self, level: int) -> None:
        self._packer = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._crc = 0
        self._size = 0
        self._fresh = True  # nothing given to the compressor since it last flushed fully
        self._head = _HEADER

    def _out(self, data: bytes) -> bytes:
        head, self._head = self._head, b""
        return head + data

    def text(self, text: str) -> bytes:
        data = text.encode()
        if not data:
            return b""
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        self._fresh = False
        return self._out(self._packer.compress(data))

    def piece(self, piece: Packed) -> bytes:
        flushed = b"" if self._fresh else self._packer.flush(zlib.Z_FULL_FLUSH)
        self._fresh = True
        self._crc = crc32_combine(self._crc, piece.crc, piece.size)
        self._size += piece.size
        return self._out(flushed + piece.body)

    def finish(self) -> bytes:
        return self._out(self._packer.flush(zlib.Z_FINISH)) + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)
