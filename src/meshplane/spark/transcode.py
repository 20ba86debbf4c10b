"""A msgpack value to JSON text in compiled code, byte for byte what ``msgspec.json.encode`` gives for
what ``msgspec.msgpack.decode`` makes of it: the ``value`` of an event whose data is a JSON object, a
list or a number (what a Python service posting dicts, as JSON or msgpack, stores).

Maps with text keys, arrays, text (escaped as msgspec escapes it), binary (base64, as msgspec writes
bytes), nil, booleans and integers are written as they are met, and so are floats whose shortest
digits are plain decimals and certain (12.5, 0.1, 1234.56: what services send). Other floats are
written from texts made by msgspec itself (its shortest round-trip digits and exponent style, NaN and
infinities as null): a chunk with such floats is scanned twice, first collecting them, then writing
each one's text in turn. Anything
msgspec would decode otherwise or refuse (extension types, keys that are not text, a key twice in one
map, bad UTF-8, nesting deeper than :data:`DEPTH`) is left to the general decoder.
"""

from __future__ import annotations

import msgspec
import numba
import numpy as np
import numpy.typing as npt

from meshplane.spark.bytescan import _be, _copy, _float_of, _high_bits, _le64, _text, _utf8

#: What :func:`transcode` returns instead of a position: the general decoder's, or a larger ``out``.
COMPLEX_VALUE, OUT_FULL_VALUE = -1, -2
DEPTH = 64  # nested maps and arrays
MAX_KEYS = 1024  # keys of the maps open at once (each map's are compared for duplicates)
KEY_FIELDS = 5  # ``keys`` columns: start and length in buf, the map's number, its JSON's start and length
MAX_MAP_KEYS = 256  # keys of one map: compared pairwise
# Stack columns: items left in the container, 1 for a map, 1 if a map's key comes next, its first key,
# the map's number, the number of an earlier map whose keys its own have repeated so far (or -1).
_LEFT, _IS_MAP, _KEY_NEXT, _KEYS_FROM, _MAP, _REPEATS = 0, 1, 2, 3, 4, 5
STACK_FIELDS = 6


def _escapes() -> npt.NDArray[np.uint8]:
    """msgspec's: ``"`` and ``\\`` escaped, \\b \\t \\n \\f \\r short, other control bytes \\u00xx."""
    table = np.zeros(256, np.uint8)
    table[:0x20] = ord("u")
    for char, short in zip(b'"\\\b\t\n\f\r', b'"\\btnfr', strict=True):
        table[char] = short
    return table


ESCAPES = _escapes()
HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
BASE64 = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)
POWERS = np.array([10.0**k for k in range(18)])  # exact: 10**k < 2**53 * 2**k
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONES_8, _HIGH_8 = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080)  # each byte's
_SPACES, _QUOTES, _BACKSLASHES = (np.uint64(0x0101010101010101 * c) for c in (0x20, 0x22, 0x5C))
NO_FLOATS = np.zeros(0, np.uint8), np.zeros((0, 2), np.int64)


@numba.njit(inline="always")
def _escaped8(word):  # type: ignore[no-untyped-def]
    """Nonzero if one of eight bytes may need escaping (below 0x20, ``"`` or ``\\``). A false alarm (a
    byte just above one that does) only sends the word through the byte-by-byte path."""
    below = (word - _SPACES) & ~word
    quote, backslash = word ^ _QUOTES, word ^ _BACKSLASHES
    return (below | ((quote - _ONES_8) & ~quote) | ((backslash - _ONES_8) & ~backslash)) & _HIGH_8


@numba.njit(inline="always")
def _same(buf, a, b, length):  # type: ignore[no-untyped-def]
    """Whether ``buf[a:a + length]`` and ``buf[b:b + length]`` hold the same bytes."""
    i = 0
    while i + 8 <= length:
        if _le64(buf, a + i) != _le64(buf, b + i):
            return False
        i += 8
    while i < length:
        if buf[a + i] != buf[b + i]:
            return False
        i += 1
    return True


@numba.njit(inline="always")
def _string(buf, start, length, out, at):  # type: ignore[no-untyped-def]
    """``buf[start:start + length]`` as a JSON string at ``out[at]`` (room checked): the end."""
    out[at] = 34
    at += 1
    run, end = start, start + length
    i = start
    while i < end:
        if i + 8 <= end and not _escaped8(_le64(buf, i)):
            i += 8  # eight bytes that need no escape
            continue
        escape = ESCAPES[buf[i]]
        if escape == 0:
            i += 1
            continue
        _copy(out, at, buf, run, i - run)
        at += i - run
        out[at] = 92
        if escape == 117:  # \u00xx
            out[at + 1], out[at + 2], out[at + 3] = 117, 48, 48
            out[at + 4], out[at + 5] = HEX[buf[i] >> 4], HEX[buf[i] & 15]
            at += 6
        else:
            out[at + 1] = escape
            at += 2
        i += 1
        run = i
    _copy(out, at, buf, run, end - run)
    at += end - run
    out[at] = 34
    return at + 1


@numba.njit(inline="always")
def _base64(buf, start, length, out, at):  # type: ignore[no-untyped-def]
    """Bytes as msgspec writes them in JSON: a string of their base64 (padded)."""
    out[at] = 34
    at += 1
    i, end = start, start + length
    while i + 3 <= end:
        n = (np.uint32(buf[i]) << 16) | (np.uint32(buf[i + 1]) << 8) | np.uint32(buf[i + 2])
        out[at], out[at + 1] = BASE64[n >> 18], BASE64[(n >> 12) & 63]
        out[at + 2], out[at + 3] = BASE64[(n >> 6) & 63], BASE64[n & 63]
        at += 4
        i += 3
    if end - i == 1:
        n = np.uint32(buf[i]) << 16
        out[at], out[at + 1], out[at + 2], out[at + 3] = BASE64[n >> 18], BASE64[(n >> 12) & 63], 61, 61
        at += 4
    elif end - i == 2:
        n = (np.uint32(buf[i]) << 16) | (np.uint32(buf[i + 1]) << 8)
        out[at], out[at + 1] = BASE64[n >> 18], BASE64[(n >> 12) & 63]
        out[at + 2], out[at + 3] = BASE64[(n >> 6) & 63], 61
        at += 4
    out[at] = 34
    return at + 1


@numba.njit(inline="always")
def _integer(magnitude, negative, out, at):  # type: ignore[no-untyped-def]
    """A uint64 magnitude (and sign) in decimal at ``out[at]``: the end."""
    if negative:
        out[at] = 45
        at += 1
    digits, rest = 1, magnitude // np.uint64(10)
    while rest:
        digits += 1
        rest //= np.uint64(10)
    for k in range(digits - 1, -1, -1):
        out[at + k] = 48 + np.uint8(magnitude % np.uint64(10))
        magnitude //= np.uint64(10)
    return at + digits


@numba.njit(inline="always")
def _plain_float(x, out, at):  # type: ignore[no-untyped-def]
    """``x`` as msgspec writes it, where that is plain decimals (1e-4 <= |x| < 1e15, or zero) and the
    shortest digits are certain: the end, or -1 (then msgspec writes it).

    m / 10**k is IEEE's nearest double to the decimal m * 10**-k (both exact, the division rounded
    correctly), as a parser's: it reads back as ``x``. The least k with such an m gives the fewest digits
    (below 1e15 a double's spacing is under 1: no shorter integer part reads back as ``x``); an m that
    is not the only one at its k is left to msgspec, which takes the nearest.
    """
    negative = x < 0 or (x == 0 and np.signbit(x))
    magnitude = abs(x)
    if magnitude != 0 and not 1e-4 <= magnitude < 1e15:
        return -1
    for k in range(18):
        scale = POWERS[k]
        scaled = magnitude * scale
        if scaled >= 9007199254740992.0:  # 2**53: integers stop being exact
            return -1
        m = np.floor(scaled + 0.5)
        if m / scale == magnitude:
            if (m - 1) / scale == magnitude or (m + 1) / scale == magnitude:
                return -1
            if negative:
                out[at] = 45
                at += 1
            whole = np.uint64(m)
            at = _integer(whole // np.uint64(POWERS[k]), False, out, at)
            out[at] = 46
            at += 1
            if k == 0:
                out[at] = 48
                return at + 1
            fraction = whole % np.uint64(POWERS[k])
            for d in range(k - 1, -1, -1):
                out[at + d] = 48 + np.uint8(fraction % np.uint64(10))
                fraction //= np.uint64(10)
            return at + k
        if (m - 1) / scale == magnitude or (m + 1) / scale == magnitude:
            return -1
    return -1


@numba.njit(cache=True, nogil=True)
def transcode(buf, pos, stop, out, state, float_text, float_bounds, floats, stack, keys):  # type: ignore[no-untyped-def]
    """The msgpack value at ``buf[pos]`` (within ``stop``) as JSON at ``out[state[0]]``: its end in
    ``buf``, or COMPLEX_VALUE or OUT_FULL_VALUE. ``state``: [out's fill, next float text, floats collected,
    maps numbered].

    With ``float_bounds`` empty, floats are collected into ``floats`` and written as nothing (the
    output is then only good for finding them); else the k-th float is ``float_text[bounds[k]]``.
    ``stack`` (DEPTH x STACK_FIELDS) is scratch; ``keys`` (MAX_KEYS x KEY_FIELDS, map numbers -1 at
    first) is kept from one value to the next of a scan, whose ``out`` is only appended to.

    A service sends the same keys in each event: a map whose keys so far are those of an earlier map,
    slot for slot (``keys[k]`` still holds the key last written at slot k), takes the next one's JSON
    from where that map's was written, without checking it again: it was checked (UTF-8, not twice
    in its map) when first met, and the keys of the earlier map were distinct, so these are.
    """
    at = state[0]
    # Each check of room leaves DEPTH bytes spare: what a value completes (brackets closing every
    # container open, then a ':' or ',') is written unchecked.
    room = out.shape[0] - DEPTH
    depth = 0
    held = 0  # keys in ``keys``
    while True:
        if pos >= stop or room - at < 32:
            return COMPLEX_VALUE if pos >= stop else OUT_FULL_VALUE
        b = buf[pos]
        if depth > 0 and stack[depth - 1, _KEY_NEXT]:
            top = depth - 1
            start, length = _text(buf, pos, stop, False)
            if start < 0 or held == MAX_KEYS or held - stack[top, _KEYS_FROM] == MAX_MAP_KEYS:
                return COMPLEX_VALUE
            repeats = keys[held, 2] if held == stack[top, _KEYS_FROM] else stack[top, _REPEATS]
            written = keys[held, 4]
            if (
                repeats >= 0
                and keys[held, 2] == repeats
                and keys[held, 1] == length
                and _same(buf, keys[held, 0], start, length)
            ):
                if room - at < written:
                    return OUT_FULL_VALUE
                _copy(out, at, out, keys[held, 3], written)  # an earlier part of out
            else:
                repeats = -1
                if _high_bits(buf, start, length) and not _utf8(buf, start, length):
                    return COMPLEX_VALUE
                for k in range(stack[top, _KEYS_FROM], held):
                    if keys[k, 1] == length and _same(buf, keys[k, 0], start, length):
                        return COMPLEX_VALUE  # msgspec keeps the last value at the first key's place
                if room - at < 6 * length + 3:
                    return OUT_FULL_VALUE
                written = _string(buf, start, length, out, at) - at
            stack[top, _REPEATS] = repeats
            keys[held, 0], keys[held, 1], keys[held, 2] = start, length, stack[top, _MAP]
            keys[held, 3], keys[held, 4] = at, written
            held += 1
            at += written
            pos = start + length
        elif b <= 0x7F:
            at = _integer(np.uint64(b), False, out, at)
            pos += 1
        elif b >= 0xE0:
            at = _integer(np.uint64(256 - np.int64(b)), True, out, at)
            pos += 1
        elif b <= 0x9F or 0xDC <= b <= 0xDF:  # a map or an array
            is_map = b <= 0x8F or b >= 0xDE
            if b <= 0x9F:
                count, header = np.int64(b & 0x0F), 1
            else:
                header = 3 if b == 0xDC or b == 0xDE else 5
                if pos + header > stop:
                    return COMPLEX_VALUE
                count = np.int64(_be(buf, pos + 1, header - 1))
            pos += header
            if count > stop - pos:
                return COMPLEX_VALUE
            out[at] = 123 if is_map else 91
            at += 1
            if count > 0:
                if depth == DEPTH:
                    return COMPLEX_VALUE
                stack[depth, _LEFT], stack[depth, _IS_MAP] = count, is_map
                stack[depth, _KEY_NEXT], stack[depth, _KEYS_FROM] = is_map, held
                stack[depth, _MAP], stack[depth, _REPEATS] = state[3], -1
                state[3] += is_map
                depth += 1
                continue
            out[at] = 125 if is_map else 93
            at += 1
        elif b == 0xC0:
            out[at], out[at + 1], out[at + 2], out[at + 3] = 110, 117, 108, 108
            at += 4
            pos += 1
        elif b == 0xC2:
            out[at], out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 102, 97, 108, 115, 101
            at += 5
            pos += 1
        elif b == 0xC3:
            out[at], out[at + 1], out[at + 2], out[at + 3] = 116, 114, 117, 101
            at += 4
            pos += 1
        elif 0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB or 0xC4 <= b <= 0xC6:  # text or bytes
            start, length = _text(buf, pos, stop, True)
            if start < 0:
                return COMPLEX_VALUE
            if b >= 0xC4 and b <= 0xC6:
                if room - at < 4 * (length // 3) + 8:
                    return OUT_FULL_VALUE
                at = _base64(buf, start, length, out, at)
            else:
                if _high_bits(buf, start, length) and not _utf8(buf, start, length):
                    return COMPLEX_VALUE
                if room - at < 6 * length + 3:
                    return OUT_FULL_VALUE
                at = _string(buf, start, length, out, at)
            pos = start + length
        elif 0xCC <= b <= 0xD3:  # uint8..64, int8..64
            size = 1 << ((b - 0xCC) & 3)
            if pos + 1 + size > stop:
                return COMPLEX_VALUE
            magnitude = _be(buf, pos + 1, size)
            negative = False
            if b >= 0xD0 and magnitude >> np.uint64(8 * size - 1):  # two's complement, negative
                negative = True
                magnitude = (~magnitude + np.uint64(1)) & (_ONES >> np.uint64(64 - 8 * size))
            at = _integer(magnitude, negative, out, at)
            pos += 1 + size
        elif b == 0xCA or b == 0xCB:
            size = 4 if b == 0xCA else 8
            if pos + 1 + size > stop:
                return COMPLEX_VALUE
            x = _float_of(_be(buf, pos + 1, size), size)  # msgspec reads a float32 as the double it is
            written = _plain_float(x, out, at)
            if written >= 0:
                at = written
            elif float_bounds.shape[0] == 0:
                floats[state[2]] = x
                state[2] += 1
            else:
                k = state[1]
                if k >= float_bounds.shape[0]:
                    return COMPLEX_VALUE
                length = float_bounds[k, 1] - float_bounds[k, 0]
                _copy(out, at, float_text, float_bounds[k, 0], length)
                at += length
                state[1] = k + 1
            pos += 1 + size
        else:  # extension types (msgspec makes Ext or datetime), 0xC1 (never used)
            return COMPLEX_VALUE
        # A value is complete: close what it completes.
        while depth > 0:
            top = depth - 1
            if stack[top, _KEY_NEXT]:
                stack[top, _KEY_NEXT] = 0
                out[at] = 58
                at += 1
                break
            stack[top, _LEFT] -= 1
            if stack[top, _LEFT] > 0:
                stack[top, _KEY_NEXT] = stack[top, _IS_MAP]
                out[at] = 44
                at += 1
                break
            out[at] = 125 if stack[top, _IS_MAP] else 93
            at += 1
            held = stack[top, _KEYS_FROM]
            depth -= 1
        if depth == 0:
            state[0] = at
            return pos


def float_texts(floats: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """msgspec's JSON text of each float (one call for all): the texts and each one's (start, end)."""
    if len(floats) == 0:
        return NO_FLOATS
    text = np.frombuffer(msgspec.json.encode(floats.tolist()), np.uint8)[1:-1]  # [a,b,...]: no comma in one
    commas = np.flatnonzero(text == ord(","))
    bounds = np.empty((len(floats), 2), np.int64)
    bounds[0, 0], bounds[1:, 0] = 0, commas + 1
    bounds[:-1, 1], bounds[-1, 1] = commas, len(text)
    return np.ascontiguousarray(text), bounds
