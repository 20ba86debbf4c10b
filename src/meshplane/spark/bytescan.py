"""Byte-level pieces of the compiled record scan (numba): zlib's crc32, msgpack headers, UTF-8 checks and
unaligned loads and copies between uint8 arrays. :mod:`meshplane.spark.columnar` and
:mod:`meshplane.spark.transcode` build on them."""

from __future__ import annotations

import platform
from typing import Any

import llvmlite.binding
import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _crc_table() -> npt.NDArray[np.uint32]:
    """zlib's CRC-32 (reflected polynomial 0xEDB88320), slicing-by-8 tables."""
    table = np.zeros((8, 256), dtype=np.uint32)
    for byte in range(256):
        c = byte
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table[0, byte] = c
    for byte in range(256):
        c = int(table[0, byte])
        for k in range(1, 8):
            c = int(table[0, c & 0xFF]) ^ (c >> 8)
            table[k, byte] = c
    return table


CRC_TABLE = _crc_table()


@numba.njit(inline="always")
def _word(c, word, t):  # type: ignore[no-untyped-def]
    """Eight message bytes (``word``, little-endian) through the slicing-by-8 tables."""
    lo = c ^ np.uint32(word & np.uint64(0xFFFFFFFF))
    hi = np.uint32(word >> np.uint64(32))
    return (
        t[7, lo & 0xFF]
        ^ t[6, (lo >> 8) & 0xFF]
        ^ t[5, (lo >> 16) & 0xFF]
        ^ t[4, lo >> 24]
        ^ t[3, hi & 0xFF]
        ^ t[2, (hi >> 8) & 0xFF]
        ^ t[1, (hi >> 16) & 0xFF]
        ^ t[0, hi >> 24]
    )


@numba.njit(inline="always")
def _bytes_le64(buf, i):  # type: ignore[no-untyped-def]
    """Eight bytes from ``i`` as a little-endian uint64, on any CPU (LLVM merges the loads on x86)."""
    word = np.uint64(0)
    for k in range(8):
        word |= np.uint64(buf[i + k]) << np.uint64(8 * k)
    return word


@numba.njit(cache=True, nogil=True)
def _crc32_tables(buf, start, stop, t):  # type: ignore[no-untyped-def]
    """zlib's crc32 of ``buf[start:stop]``, eight bytes a step through the slicing-by-8 tables."""
    c = np.uint32(0xFFFFFFFF)
    i = start
    while i + 8 <= stop:
        c = _word(c, _bytes_le64(buf, i), t)
        i += 8
    while i < stop:
        c = t[0, (c ^ buf[i]) & 0xFF] ^ (c >> 8)
        i += 1
    return c ^ np.uint32(0xFFFFFFFF)


# --- crc32 with carry-less multiplication (x86-64 PCLMULQDQ); tables elsewhere ---------------------------


def _clmul_typer(typingctx: Any, a: Any, b: Any) -> Any:
    """The 128-bit carry-less product of two uint64: (low, high) halves."""
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64)  # type: ignore[no-untyped-call]

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i32, i64 = ir.IntType(32), ir.IntType(64)
        pair = ir.VectorType(i64, 2)
        function = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, ir.FunctionType(pair, [pair, pair, ir.IntType(8)]), "llvm.x86.pclmulqdq"
        )
        zeros = ir.Constant(pair, [ir.Constant(i64, 0), ir.Constant(i64, 0)])
        product = builder.call(
            function,
            [
                builder.insert_element(zeros, args[0], ir.Constant(i32, 0)),
                builder.insert_element(zeros, args[1], ir.Constant(i32, 0)),
                ir.Constant(ir.IntType(8), 0),
            ],
        )
        halves = [builder.extract_element(product, ir.Constant(i32, k)) for k in (0, 1)]
        return context.make_tuple(builder, signature.return_type, halves)

    return sig, codegen


def _le64_typer(typingctx: Any, buf: Any, index: Any) -> Any:
    """Eight bytes of a uint8 array from ``index`` as a little-endian uint64 (one unaligned load)."""
    sig = types.uint64(buf, index)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.bitcast(builder.gep(array.data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(address, align=1)

    return sig, codegen


def _copy_typer(typingctx: Any, dst: Any, dst_at: Any, src: Any, src_at: Any, count: Any) -> Any:
    """memcpy between two uint8 arrays (numba's slice assignment costs ~4x for short runs)."""
    sig = types.void(dst, dst_at, src, src_at, count)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        to = context.make_array(signature.args[0])(context, builder, args[0])
        source = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memcpy(  # type: ignore[no-untyped-call]
            builder, builder.gep(to.data, [args[1]]), builder.gep(source.data, [args[3]]), args[4], 1
        )
        return context.get_dummy_value()

    return sig, codegen


def _float_of_typer(typingctx: Any, bits: Any, size: Any) -> Any:
    """The float64 (``size`` 8) or float32 (``size`` 4, the low half) whose bits are ``bits``: a register
    move, not a view through a one-element array allocated for each float."""
    sig = types.float64(types.uint64, size)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        double = builder.bitcast(args[0], ir.DoubleType())
        single = builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())
        single = builder.fpext(single, ir.DoubleType())
        is_double = builder.icmp_signed("==", args[1], ir.Constant(args[1].type, 8))
        return builder.select(is_double, double, single)

    return sig, codegen


_clmul: Any = intrinsic(_clmul_typer)
_le64: Any = intrinsic(_le64_typer)
_copy: Any = intrinsic(_copy_typer)
_float_of: Any = intrinsic(_float_of_typer)


# Constants of the reflected gzip polynomial P, from Intel's "Fast CRC Computation for Generic
# Polynomials Using PCLMULQDQ" (as Linux's crc32-pclmul uses them): folding 128 bits forward takes
# x^(128+32) and x^(128-32) mod P; the final reduction x^64 mod P, then Barrett's P and mu.
_FOLD_LOW = np.uint64(0x1751997D0)
_FOLD_HIGH = np.uint64(0x0CCAA009E)
_FOLD_64 = np.uint64(0x163CD6124)
_POLY = np.uint64(0x1DB710641)
_MU = np.uint64(0x1F7011641)
_LOW32 = np.uint64(0xFFFFFFFF)


@numba.njit(inline="always")
def _shift_left(x, bits):  # type: ignore[no-untyped-def]
    """``x << bits`` for 0 <= bits <= 64 (a shift by 64 is undefined in LLVM)."""
    return np.uint64(0) if bits >= 64 else x << np.uint64(bits)


@numba.njit(inline="always")
def _fold(low, high, buf, i):  # type: ignore[no-untyped-def]
    """The 128-bit state carried over the 16 bytes at ``i``."""
    a_low, a_high = _clmul(low, _FOLD_LOW)
    b_low, b_high = _clmul(high, _FOLD_HIGH)
    return a_low ^ b_low ^ _le64(buf, i), a_high ^ b_high ^ _le64(buf, i + 8)


@numba.njit(cache=True, nogil=True)
def _crc32_clmul(buf, start, stop, t):  # type: ignore[no-untyped-def]
    """Fold 16 bytes at a time into a 128-bit state with the same remainder, then reduce it to 32 bits
    by carry-less multiplication (no table). The bytes are taken as if 16 - n % 16 zero bytes came
    first (leading zeros leave a zero crc register unchanged), so every block is whole: the first
    holds the first n % 16 bytes, right-aligned."""
    n = stop - start
    if n < 32:
        return _crc32_tables(buf, start, stop, t)
    r = n & 15
    first = _le64(buf, start) ^ _LOW32  # the initial crc (all ones) xored into the first 4 bytes
    if r == 0:
        low, high = first, _le64(buf, start + 8)
    elif r <= 8:
        low, high = np.uint64(0), _shift_left(first, 8 * (8 - r))
    else:
        low, high = _shift_left(first, 8 * (16 - r)), _le64(buf, start + r - 8)
        if r < 12:  # initial-crc bytes among the ones loaded again for the high half
            high ^= _LOW32 >> np.uint64(8 * (r - 8))
    i = start + 16 if r == 0 else start + r
    if 0 < r < 4:  # initial-crc bytes past the first block go into the next
        low, high = _fold(low, high, buf, i)
        low ^= _LOW32 >> np.uint64(8 * r)
        i += 16
    while i + 16 <= stop:
        low, high = _fold(low, high, buf, i)
        i += 16
    # 128 -> 96 bits (the low half moved up by x^(128-32)), 96 -> 64, then Barrett 64 -> 32.
    t_low, t_high = _clmul(low, _FOLD_HIGH)
    x_low = high ^ t_low
    z_low, _ = _clmul(x_low & _LOW32, _FOLD_64)
    w = ((x_low >> np.uint64(32)) | (t_high << np.uint64(32))) ^ z_low
    q, _ = _clmul(w & _LOW32, _MU)
    p, _ = _clmul(q & _LOW32, _POLY)
    return np.uint32(((w ^ p) >> np.uint64(32)) & _LOW32) ^ np.uint32(0xFFFFFFFF)


def _has_clmul() -> bool:
    features = llvmlite.binding.get_host_cpu_features()
    return platform.machine().lower() in ("x86_64", "amd64") and features.get("pclmul", False)


HAS_CLMUL = _has_clmul()
_crc32 = _crc32_clmul if HAS_CLMUL else _crc32_tables  # zlib's crc32 of buf[start:stop]


@numba.njit(inline="always")
def _be(buf, pos, size):  # type: ignore[no-untyped-def]
    """An unsigned big-endian integer of ``size`` bytes (inlined: with ``size`` known, LLVM makes one
    load and a byte swap of the loop; called, the loop ran byte by byte)."""
    value = np.uint64(0)
    for i in range(size):
        value = (value << np.uint64(8)) | np.uint64(buf[pos + i])
    return value


@numba.njit(cache=True, nogil=True)
def _text(buf, pos, stop, allow_bin):  # type: ignore[no-untyped-def]
    """A msgpack str (or bin, if allowed) at ``pos`` in the record ending at ``stop``: (start, length).

    start is -1 when it is not one, or when it would run past the record: no read leaves a record.
    """
    b = buf[pos] if pos < stop else 0
    if 0xA0 <= b <= 0xBF:
        header = 1
    elif b == 0xD9 or (allow_bin and b == 0xC4):
        header = 2
    elif b == 0xDA or (allow_bin and b == 0xC5):
        header = 3
    elif b == 0xDB or (allow_bin and b == 0xC6):
        header = 5
    else:
        return np.int64(-1), np.int64(0)
    if pos + header > stop:
        return np.int64(-1), np.int64(0)
    length = np.int64(b & 0x1F) if header == 1 else np.int64(_be(buf, pos + 1, header - 1))
    if pos + header + length > stop:
        return np.int64(-1), np.int64(0)
    return pos + header, length


@numba.njit(inline="always")
def _high_bits(buf, start, length):  # type: ignore[no-untyped-def]
    """Nonzero if any byte of ``buf[start:start + length]`` is not ASCII."""
    bits = np.uint64(0)
    i, end = start, start + length
    while i + 8 <= end:
        bits |= _le64(buf, i)
        i += 8
    while i < end:
        bits |= np.uint64(buf[i])
        i += 1
    return bits & np.uint64(0x8080808080808080)


@numba.njit(cache=True, nogil=True)
def _utf8(buf, start, length):  # type: ignore[no-untyped-def]
    """Whether ``buf[start:start + length]`` is well-formed UTF-8 (Unicode's table 3-7: no overlong
    forms, surrogates or code points past U+10FFFF), as msgspec requires of a msgpack str."""
    i, end = start, start + length
    while i + 8 <= end and (_le64(buf, i) & np.uint64(0x8080808080808080)) == 0:
        i += 8  # ASCII, eight bytes at a time
    while i < end:
        b = buf[i]
        if b < 0x80:
            i += 1
            continue
        low, high = 0x80, 0xBF  # the range of the byte after the lead byte
        if 0xC2 <= b <= 0xDF:
            more = 1
        elif 0xE0 <= b <= 0xEF:
            more = 2
            if b == 0xE0:
                low = 0xA0
            elif b == 0xED:
                high = 0x9F
        elif 0xF0 <= b <= 0xF4:
            more = 3
            if b == 0xF0:
                low = 0x90
            elif b == 0xF4:
                high = 0x8F
        else:
            return False
        if i + more >= end:
            return False
        if not low <= buf[i + 1] <= high:
            return False
        for k in range(2, more + 1):
            if not 0x80 <= buf[i + k] <= 0xBF:
                return False
        i += more + 1
    return True
