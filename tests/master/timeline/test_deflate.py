"""One gzip member of text and pieces compressed apart (master/timeline/deflate.py): every reader reads
the whole text, and the trailer's CRC-32 is the whole text's."""

import gzip
import subprocess
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from master.timeline.deflate import Joiner, crc32_combine, pack


@given(st.binary(max_size=300), st.binary(max_size=3000))
def test_the_combined_crc_is_the_crc_of_the_joined_bytes(a, b):
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_the_combined_crc_holds_for_a_piece_past_four_gibibytes():
    """The gzip trailer keeps the length modulo 2^32; the CRC's shift must use the whole length."""
    mib = bytes(1 << 20)
    zeros, after_x = 0, zlib.crc32(b"x")
    for _ in range(4097):  # 4 GiB and one MiB of zero bytes, read by zlib itself
        zeros, after_x = zlib.crc32(mib, zeros), zlib.crc32(mib, after_x)
    assert crc32_combine(zlib.crc32(b"x"), zeros, 4097 << 20) == after_x


texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=400)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.booleans(), texts), max_size=12), st.integers(min_value=1, max_value=9))
def test_text_and_pieces_make_one_member_that_reads_as_their_text(parts, level):
    joiner, out, want = Joiner(level), [], []
    for packed, text in parts:
        if packed:
            piece = pack(text)
            assert piece.text() == text
            out.append(joiner.piece(piece))
        else:
            out.append(joiner.text(text))
        want.append(text)
    out.append(joiner.finish())
    data = b"".join(out)
    reader = zlib.decompressobj(31)
    assert reader.decompress(data) == "".join(want).encode()
    assert reader.eof and reader.unused_data == b""
    assert gzip.decompress(data) == "".join(want).encode()


def test_the_gzip_command_checks_the_stream():
    joiner = Joiner(7)
    data = joiner.text('{"a":[') + joiner.piece(pack(",1,2,3" * 10000)) + joiner.text(',"\u00e9"]}') + joiner.finish()
    assert subprocess.run(["gzip", "-t"], input=data).returncode == 0
    assert gzip.decompress(data).decode() == '{"a":[' + ",1,2,3" * 10000 + ',"\u00e9"]}'
