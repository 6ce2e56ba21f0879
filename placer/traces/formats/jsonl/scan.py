"""Vectorized parsing of JSONL routing rows that share one layout.

``json.loads`` costs microseconds a line, too slow for traces of 10^8 rows.  Routing
logs are written by one program, so nearly every line has the same keys in the same
order and the same number of values.  This module cuts a block of such lines into
*tokens* (runs of bytes other than ``{}[]:,"`` and whitespace) with numpy, checks each
line against a *template* taken from one line that ``json.loads`` parsed, and reads the
numbers out of the matching lines, all without a Python loop over rows.

A line matches the template when it has the same number of tokens and of structural
characters, starts with ``{`` and ends with ``}``, has the template's key names at the
key positions, digits where integers are expected (``-`` allowed before expert ids),
number characters where floats are expected, ``route`` as its ``type`` if the template
has one, and no backslash.  Integers are read 8 digits at a time from 8-byte words
(:func:`_ints`).  Lines that do not match go through ``json.loads`` in the
caller, which reports them exactly; both paths give the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Scan", "Template", "scan_block"]


_NOT_DIGIT = np.ones(256, dtype=bool)
_NOT_DIGIT[list(b"0123456789")] = False
_NOT_FLOAT = np.ones(256, dtype=bool)
_NOT_FLOAT[list(b"0123456789.eE+-")] = False

#: Longest integer token read (more digits go to json.loads).
_MAX_INT_DIGITS = 18
#: Longest string token used as a request label by the fast path.
_MAX_LABEL = 64


@dataclass
class Scan:
    """Lines and tokens of one block of bytes.

    Attributes
    ----------
    buf: ``[bytes]`` uint8, the block.
    words: ``[bytes]`` uint64, the 8 bytes from each offset, little-endian (zeros past
        the end): one gather reads 8 characters.
    line_start, line_end: ``[lines]`` byte offsets (end excludes the newline).
    tok_start, tok_end: ``[tokens]`` byte offsets of each token.
    first_tok, num_tok: ``[lines]`` index of each line's first token, tokens per line.
    num_struct: ``[lines]`` structural characters per line.
    """

    buf: np.ndarray
    words: np.ndarray
    line_start: np.ndarray
    line_end: np.ndarray
    tok_start: np.ndarray
    tok_end: np.ndarray
    first_tok: np.ndarray
    num_tok: np.ndarray
    num_struct: np.ndarray
    has_backslash: np.ndarray

    @property
    def num_lines(self) -> int:
        return int(self.line_start.size)

    def tokens_of(self, line: int) -> list[bytes]:
        """Token texts of one line (for building a template)."""
        f, n = int(self.first_tok[line]), int(self.num_tok[line])
        raw = self.buf.tobytes()
        return [raw[self.tok_start[i] : self.tok_end[i]] for i in range(f, f + n)]


def scan_block(data: bytes) -> Scan:
    """Cut ``data`` (whole lines) into lines and tokens.

    Only ``bytes.translate``, elementwise operations, ``flatnonzero`` and
    ``np.add.reduceat`` touch the whole buffer (``np.cumsum`` over bytes is an order of
    magnitude slower).
    """
    padded = np.frombuffer(data + bytes(8), dtype=np.uint8)
    buf = padded[: len(data)]
    words = np.lib.stride_tricks.as_strided(padded, shape=(buf.size + 1, 8), strides=(1, 1))
    words = words.view("<u8")[:, 0]
    nl = np.flatnonzero(buf == 10)
    if buf.size and buf[-1] != 10:
        nl = np.append(nl, buf.size)
    line_start = np.empty(nl.size, dtype=np.int64)
    line_start[:1] = 0
    line_start[1:] = nl[:-1] + 1
    struct = _structural(data)
    tok = (~(struct | (buf <= 32))).view(np.int8)
    edge = np.empty(buf.size + 1, dtype=np.int8)  # +1 where a token starts, -1 after it
    edge[0] = edge[-1] = 0
    if buf.size:
        edge[0], edge[-1] = tok[0], -tok[-1]
        np.subtract(tok[1:], tok[:-1], out=edge[1:-1])
    tok_start = np.flatnonzero(edge == 1)
    tok_end = np.flatnonzero(edge == -1)
    first_tok = np.searchsorted(tok_start, line_start)
    num_tok = np.diff(first_tok, append=tok_start.size)
    if nl.size:
        num_struct = np.add.reduceat(struct.view(np.uint8), line_start, dtype=np.int32)
    else:
        num_struct = np.zeros(0, dtype=np.int32)
    has_backslash = np.zeros(nl.size, dtype=bool)
    if data.find(b"\\") >= 0:
        bs = np.flatnonzero(buf == 92)
        has_backslash[np.searchsorted(nl, bs)] = True
    return Scan(
        buf=buf,
        words=words,
        line_start=line_start,
        line_end=nl,
        tok_start=tok_start,
        tok_end=tok_end,
        first_tok=first_tok,
        num_tok=num_tok,
        num_struct=num_struct,
        has_backslash=has_backslash,
    )


#: ``bytes.translate`` table: 1 for JSON structure ``{}[]:,"``, 0 for other bytes.
_STRUCTURAL = bytes(1 if c in b'{}[]:,"' else 0 for c in range(256))


def _structural(data: bytes) -> np.ndarray:
    """``[bytes]`` bool: which bytes of ``data`` are JSON structure (one C pass through a
    table; numpy would widen the 1-byte indices of a table lookup to 8 bytes)."""
    return np.frombuffer(data.translate(_STRUCTURAL), dtype=bool)


@dataclass(frozen=True)
class Template:
    """Where each field's tokens sit in a line of the common layout.

    ``fields`` maps canonical names (``layer``, ``experts``, ``weights``, ``token``,
    ``request``, ``step``, ``rank``, ``type``) to the token offsets of their values.
    """

    num_tok: int
    num_struct: int
    keys: tuple[tuple[int, bytes], ...]  # (token offset, key text)
    fields: dict[str, tuple[int, ...]]
    request_is_str: bool

    @property
    def k(self) -> int:
        return len(self.fields["experts"])

    @classmethod
    def from_line(
        cls, obj: dict[str, Any], scan: Scan, line: int, aliases: dict[str, tuple[str, ...]]
    ) -> Template | None:
        """The template of a line ``json.loads`` gave as ``obj``; None if it has none."""
        toks = scan.tokens_of(line)
        keys: list[tuple[int, bytes]] = []
        where: dict[str, tuple[int, ...]] = {}
        pos = 0
        for key, value in obj.items():
            kb = key.encode()
            if pos >= len(toks) or toks[pos] != kb:
                return None
            keys.append((pos, kb))
            pos += 1
            vals = value if isinstance(value, list) else [value]
            if isinstance(value, list) and not value:
                return None
            span = []
            for v in vals:
                if isinstance(v, dict | list) or pos >= len(toks):
                    return None
                if isinstance(v, str) and (not v or toks[pos] != v.encode()):
                    return None
                is_int = isinstance(v, int) and not isinstance(v, bool)
                if is_int and toks[pos] != str(v).encode():
                    return None
                span.append(pos)
                pos += 1
            where[key] = tuple(span)
        if pos != len(toks):
            return None
        fields: dict[str, tuple[int, ...]] = {}
        for name, names in aliases.items():
            for alias in names:
                if alias in obj:
                    fields[name] = where[alias]
                    break
        if "type" in obj:
            fields["type"] = where["type"]
        singles = ("layer", "token", "request", "step", "rank", "type")
        if any(len(fields.get(n, (0,))) != 1 for n in singles):
            return None
        if "layer" not in fields or "experts" not in fields:
            return None
        if "weights" in fields and len(fields["weights"]) != len(fields["experts"]):
            return None
        for name in ("layer", "token", "step", "rank"):
            if name in obj or any(a in obj for a in aliases.get(name, ())):
                value = next(obj[a] for a in aliases[name] if a in obj)
                if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                    return None
        experts = next(obj[a] for a in aliases["experts"] if a in obj)
        if not isinstance(experts, list) or not all(
            isinstance(e, int) and not isinstance(e, bool) for e in experts
        ):
            return None
        request = next((obj[a] for a in aliases["request"] if a in obj), None)
        if (request is not None and not isinstance(request, str | int)) or isinstance(
            request, bool
        ):
            return None
        return cls(
            num_tok=len(toks),
            num_struct=int(scan.num_struct[line]),
            keys=tuple(keys),
            fields=fields,
            request_is_str=isinstance(request, str),
        )

    # -- matching and extraction -------------------------------------------------------
    def parse(self, scan: Scan, *, weights: bool) -> tuple[np.ndarray, dict[str, Any]]:
        """Lines with this layout and their values.

        Returns ``(good [lines] bool, values)``; ``values`` holds, for the good lines in
        order, int64 ``layer [n]``, ``experts [n, k]``, ``token``/``step``/``rank [n]``
        when the layout has them, ``request [n]`` label texts (``S<width>``), and
        float32 ``weights [n, k]`` when asked for and present.
        """
        buf = scan.buf
        ok = (scan.num_tok == self.num_tok) & (scan.num_struct == self.num_struct)
        ok &= ~scan.has_backslash
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            return ok, {}
        first = buf[scan.line_start[idx]] == ord("{")
        last_pos = scan.line_end[idx] - 1
        last = buf[last_pos]
        last = np.where(last == 13, buf[np.maximum(last_pos - 1, 0)], last)
        good = first & (last == ord("}"))
        base = scan.first_tok[idx]
        # every token the checks need, gathered once per line: [lines, columns] start,
        # length and first 8 bytes (a line's tokens share a few cache lines)
        key_offs = [off for off, _ in self.keys]
        int_names = [n for n in ("layer", "token", "step", "rank") if n in self.fields]
        k = self.k
        other = [self.fields[n][0] for n in ("type", "request") if n in self.fields]
        offs = np.array(
            key_offs + [self.fields[n][0] for n in int_names] + list(self.fields["experts"])
            + list(self.fields.get("weights", ())) + other,
            dtype=np.int64,
        )
        tok = base[:, None] + offs[None, :]
        start = scan.tok_start[tok]
        length = scan.tok_end[tok] - start
        word = scan.words[start]
        nk, ni = len(key_offs), len(int_names)
        good &= (length[:, :nk] == np.array([len(kb) for _, kb in self.keys])).all(axis=1)
        good &= _words_equal(scan, start[:, :nk], word[:, :nk], [kb for _, kb in self.keys])
        values: dict[str, Any] = {}
        v, valid = _ints(scan, start[:, nk : nk + ni + k], length[:, nk : nk + ni + k],
                         word[:, nk : nk + ni + k], minus_from=ni)
        good &= valid.all(axis=1)
        for j, name in enumerate(int_names):
            values[name] = v[:, j]
        values["experts"] = v[:, ni:]
        col = nk + ni + k
        if "weights" in self.fields:
            # a number starts with a digit or a minus (not null, true, NaN, Infinity)
            first_char = word[:, col : col + k] & np.uint64(0xFF)
            number = ((first_char >= ord("0")) & (first_char <= ord("9"))) | (first_char == 45)
            good &= number.all(axis=1)
            col += k
        if "type" in self.fields:
            good &= (length[:, col] == 5) & _words_equal(
                scan, start[:, col : col + 1], word[:, col : col + 1], [b"route"]
            )
            col += 1
        if "request" in self.fields:
            null = (length[:, col] == 4) & _words_equal(
                scan, start[:, col : col + 1], word[:, col : col + 1], [b"null"]
            )
            good &= (length[:, col] <= _MAX_LABEL) & ~null
        ok[idx] = good
        if not good.all():
            keep = np.flatnonzero(good)
            values = {name: a[keep] for name, a in values.items()}
            base = base[keep]
        if "request" in self.fields:
            values["request"] = _texts(scan, base + self.fields["request"][0])
        if weights and "weights" in self.fields:
            w_tok = (base[:, None] + np.asarray(self.fields["weights"])[None, :]).ravel()
            w, w_ok = _floats(scan, w_tok)
            values["weights"] = w.reshape(-1, k)
            bad = ~w_ok.reshape(-1, k).all(axis=1)
            if bad.any():
                # a weight that is not a number (null, true): those lines take json.loads
                keep = np.flatnonzero(~bad)
                ok[idx[np.flatnonzero(good)[bad]]] = False
                values = {name: a[keep] for name, a in values.items()}
        return ok, values


def _gather(scan: Scan, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[n, width]`` bytes of tokens ``t`` (0 past each token's end) and their lengths."""
    s, e = scan.tok_start[t], scan.tok_end[t]
    length = e - s
    width = int(length.max()) if length.size else 1
    pos = s[:, None] + np.arange(width)
    inside = np.arange(width)[None, :] < length[:, None]
    chars = np.where(inside, scan.buf[np.minimum(pos, scan.buf.size - 1)], 0)
    return chars.astype(np.uint8), length


def _words_equal(
    scan: Scan, start: np.ndarray, word: np.ndarray, texts: list[bytes]
) -> np.ndarray:
    """Whether the tokens at ``start [lines, n]`` (first 8 bytes ``word``) begin with
    ``texts[j]`` in column ``j`` (8 characters a comparison; lengths are checked apart)."""
    ok = np.ones(start.shape[0], dtype=bool)
    for j, text in enumerate(texts):
        for p in range(0, len(text), 8):
            part = text[p : p + 8]
            # a shorter token (refused by its length) may end the block: stay inside
            w = word[:, j] if p == 0 else scan.words[
                np.minimum(start[:, j] + p, scan.words.size - 1)
            ]
            if len(part) < 8:
                w = w & np.uint64((1 << (8 * len(part))) - 1)
            ok &= w == np.uint64(int.from_bytes(part, "little"))
    return ok


_ZEROS = np.uint64(0x3030303030303030)  # "00000000"
_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_PLUS_SIX = np.uint64(0x0606060606060606)


def _ints(
    scan: Scan, start: np.ndarray, length: np.ndarray, word: np.ndarray, *, minus_from: int
) -> tuple[np.ndarray, np.ndarray]:
    """Integer values of tokens (digits; columns from ``minus_from`` on may start with a
    minus) and whether each is one.

    ``start``, ``length``, ``word``: ``[lines, n]`` byte offset, length and first 8
    bytes of each token.  Up to 8 digits are read from one word: the digits are shifted
    to the top bytes, '0' fills the bytes below (leading zeros), each byte is checked to
    be a digit, and pairs, quads and octets of digits are combined with three
    multiply-adds.  Longer tokens (up to ``_MAX_INT_DIGITS``) are read digit by digit.
    """
    minus = np.zeros(start.shape, dtype=bool)
    minus[:, minus_from:] = (word[:, minus_from:] & np.uint64(0xFF)) == ord("-")
    any_minus = bool(minus.any())
    if any_minus:
        word = np.where(minus, word >> np.uint64(8), word)  # a minus leaves 7 bytes
        length = length - minus
    valid = (length > 0) & (length <= _MAX_INT_DIGITS)
    valid &= (length == 1) | ((word & np.uint64(0xFF)) != ord("0"))  # JSON: no leading 0
    short = np.minimum(length, 8)
    x = word << _SHIFT[short]  # the digits to the top bytes (table: never a shift by 64)
    x |= _FILL[short]  # '0' below them
    digits_ok = ((x & _HIGH_NIBBLES) == _ZEROS) & (((x + _PLUS_SIX) & _HIGH_NIBBLES) == _ZEROS)
    d = x - _ZEROS
    d = (d & np.uint64(0x000F000F000F000F)) * np.uint64(10) + (
        (d >> np.uint64(8)) & np.uint64(0x000F000F000F000F)
    )
    d = (d & np.uint64(0x0000007F0000007F)) * np.uint64(100) + (
        (d >> np.uint64(16)) & np.uint64(0x0000007F0000007F)
    )
    d = (d & np.uint64(0x3FFF)) * np.uint64(10000) + ((d >> np.uint64(32)) & np.uint64(0x3FFF))
    value = d.view(np.int64)  # below 10^8
    long = valid & (length > 8)  # past the word
    if any_minus:
        long |= valid & minus & (length == 8)
    valid &= digits_ok | long
    if long.any():
        at = np.nonzero(long)
        value[at], valid[at] = _ints_by_digit(scan.buf, start[at] + minus[at], length[at])
    if any_minus:
        np.negative(value, out=value, where=minus)
    return value, valid


#: By digit count 0..8: the left shift that puts the digits in a word's top bytes, and
#: the '0' bytes that fill the word below them.
_SHIFT = np.array([0] + [8 * (8 - n) for n in range(1, 9)], dtype=np.uint64)
_FILL = np.array([0] + [0x3030303030303030 >> (8 * n) if n < 8 else 0 for n in range(1, 9)],
                 dtype=np.uint64)


def _ints_by_digit(
    buf: np.ndarray, s: np.ndarray, length: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Integers of ``length`` digits at byte offsets ``s``, one digit position at a time."""
    last = buf.size - 1
    valid = np.ones(s.size, dtype=bool)
    value = np.zeros(s.size, dtype=np.int64)
    for j in range(int(length.max())):
        d = buf[np.minimum(s + j, last)].astype(np.int64) - ord("0")
        inside = j < length
        valid &= ~inside | ((d >= 0) & (d <= 9))
        value = np.where(inside, value * 10 + d, value)
    return value, valid


def _texts(scan: Scan, t: np.ndarray) -> np.ndarray:
    """Token texts as a fixed-width bytes array ``S<width>``."""
    chars, _ = _gather(scan, t)
    width = max(chars.shape[1], 1)
    return np.ascontiguousarray(chars).view(f"S{width}").ravel()


def _floats(scan: Scan, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float values of tokens ``t`` and whether each is a JSON number."""
    texts = _texts(scan, t)
    try:
        return texts.astype(np.float64).astype(np.float32), np.ones(t.size, dtype=bool)
    except ValueError:
        chars, length = _gather(scan, t)
        inside = np.arange(chars.shape[1])[None, :] < length[:, None]
        ok = ~(_NOT_FLOAT[chars] & inside).any(axis=1) & (length > 0)
        out = np.zeros(t.size, dtype=np.float32)
        try:
            out[ok] = texts[ok].astype(np.float64)
        except ValueError:  # number characters that are no number ("0.0.5", "1e"): one by one
            for i in np.flatnonzero(ok).tolist():
                try:
                    out[i] = float(texts[i])
                except ValueError:
                    ok[i] = False
        return out, ok
