"""Code-point ranges -> UTF-8 byte-range sequences (the construction of Rust's utf8-ranges)."""

from __future__ import annotations

from functools import lru_cache

_MAX_BY_LEN = (0x7F, 0x7FF, 0xFFFF)


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


@lru_cache(maxsize=4096)
def utf8_sequences(lo: int, hi: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Byte-range sequences matching exactly the UTF-8 encodings of code points ``lo..hi``.

    Surrogates (U+D800..U+DFFF) are skipped: they have no UTF-8 encoding. Each sequence is a tuple
    of inclusive ``(lo_byte, hi_byte)`` pairs, one per byte of the encoding.
    """
    out: list[tuple[tuple[int, int], ...]] = []
    stack = [(lo, hi)]
    while stack:
        a, b = stack.pop()
        if a > b:
            continue
        if a <= 0xDFFF and b >= 0xD800:
            stack.append((0xE000, b))
            stack.append((a, 0xD7FF))
            continue
        split = next((m for m in _MAX_BY_LEN if a <= m < b), None)
        if split is not None:
            stack.append((split + 1, b))
            stack.append((a, split))
            continue
        if b <= 0x7F:
            out.append(((a, b),))
            continue
        done = False
        for i in range(1, 4):
            m = (1 << (6 * i)) - 1
            if a & ~m != b & ~m:
                if a & m != 0:
                    stack.append(((a | m) + 1, b))
                    stack.append((a, a | m))
                    done = True
                    break
                if b & m != m:
                    stack.append((b & ~m, b))
                    stack.append((a, (b & ~m) - 1))
                    done = True
                    break
        if done:
            continue
        ea, eb = _encode(a), _encode(b)
        out.append(tuple(zip(ea, eb)))
    return tuple(out)


def decode_complete_prefix(data: bytes) -> str:
    """``data`` decoded as UTF-8 up to its last complete character (a trailing partial or invalid
    sequence is dropped); used for jump-forward strings that end mid-character."""
    while data:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            data = data[: e.start]
    return ""
