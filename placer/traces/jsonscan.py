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
has one, and no backslash.  Lines that do not match go through ``json.loads`` in the
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
    line_start, line_end: ``[lines]`` byte offsets (end excludes the newline).
    tok_start, tok_end: ``[tokens]`` byte offsets of each token.
    first_tok, num_tok: ``[lines]`` index of each line's first token, tokens per line.
    num_struct: ``[lines]`` structural characters per line.
    """

    buf: np.ndarray
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

    Only elementwise operations, ``flatnonzero`` and ``np.add.reduceat`` touch the whole
    buffer (``np.cumsum`` over bytes is an order of magnitude slower).
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    if buf.size and buf[-1] != 10:
        nl = np.append(nl, buf.size)
    line_start = np.empty(nl.size, dtype=np.int64)
    line_start[:1] = 0
    line_start[1:] = nl[:-1] + 1
    struct = _structural(buf)
    tok = ~(struct | (buf <= 32))
    edge = np.diff(tok.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    tok_start = np.flatnonzero(edge == 1)
    tok_end = np.flatnonzero(edge == -1)
    first_tok = np.searchsorted(tok_start, line_start)
    num_tok = np.diff(first_tok, append=tok_start.size)
    if nl.size:
        num_struct = np.add.reduceat(struct.view(np.uint8), line_start, dtype=np.int32)
    else:
        num_struct = np.zeros(0, dtype=np.int32)
    bs = np.flatnonzero(buf == 92)
    has_backslash = np.zeros(nl.size, dtype=bool)
    if bs.size:
        has_backslash[np.searchsorted(nl, bs)] = True
    return Scan(
        buf=buf,
        line_start=line_start,
        line_end=nl,
        tok_start=tok_start,
        tok_end=tok_end,
        first_tok=first_tok,
        num_tok=num_tok,
        num_struct=num_struct,
        has_backslash=has_backslash,
    )


def _structural(buf: np.ndarray) -> np.ndarray:
    """``buf`` bytes that are JSON structure: ``{}[]:,"`` (comparisons beat a table lookup,
    which would first widen 1-byte indices to 8 bytes)."""
    folded = buf & 0xDF  # '{' -> '[', '}' -> ']'
    return np.asarray(
        (buf == 34) | (buf == 44) | (buf == 58) | (folded == 91) | (folded == 93)
    )


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
        if not all(isinstance(e, int) and not isinstance(e, bool) for e in experts):
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
        good &= _keys_equal(scan, base, self.keys)
        values: dict[str, Any] = {}
        for name in ("layer", "token", "step", "rank"):
            if name in self.fields:
                v, valid = _ints(scan, base + self.fields[name][0], allow_minus=False)
                values[name] = v
                good &= valid
        k = self.k
        ex_tok = (base[:, None] + np.asarray(self.fields["experts"])[None, :]).ravel()
        v, valid = _ints(scan, ex_tok, allow_minus=True)
        values["experts"] = v.reshape(-1, k)
        good &= valid.reshape(-1, k).all(axis=1)
        for off in self.fields.get("weights", ()):
            # a number starts with a digit or a minus (not null, true, NaN, Infinity)
            first_char = buf[scan.tok_start[base + off]]
            good &= ((first_char >= ord("0")) & (first_char <= ord("9"))) | (first_char == 45)
        if "type" in self.fields:
            t = base + self.fields["type"][0]
            good &= _equals(buf, scan.tok_start[t], scan.tok_end[t], b"route")
        if "request" in self.fields:
            t = base + self.fields["request"][0]
            length = scan.tok_end[t] - scan.tok_start[t]
            good &= (length <= _MAX_LABEL) & ~_equals(
                buf, scan.tok_start[t], scan.tok_end[t], b"null"
            )
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


def _equals(buf: np.ndarray, s: np.ndarray, e: np.ndarray, text: bytes) -> np.ndarray:
    ok = (e - s) == len(text)
    pos = np.minimum(s[:, None] + np.arange(len(text)), buf.size - 1)
    return np.asarray(ok & (buf[pos] == np.frombuffer(text, dtype=np.uint8)).all(axis=1))


def _gather(scan: Scan, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[n, width]`` bytes of tokens ``t`` (0 past each token's end) and their lengths."""
    s, e = scan.tok_start[t], scan.tok_end[t]
    length = e - s
    width = int(length.max()) if length.size else 1
    pos = s[:, None] + np.arange(width)
    inside = np.arange(width)[None, :] < length[:, None]
    chars = np.where(inside, scan.buf[np.minimum(pos, scan.buf.size - 1)], 0)
    return chars.astype(np.uint8), length


def _keys_equal(scan: Scan, base: np.ndarray, keys: tuple[tuple[int, bytes], ...]) -> np.ndarray:
    """Whether every key token of each line (first token ``base``) has the key's text."""
    buf = scan.buf
    ok = np.ones(base.size, dtype=bool)
    starts = []
    offsets = []
    for off, kb in keys:
        t = base + off
        ok &= (scan.tok_end[t] - scan.tok_start[t]) == len(kb)
        starts.append(scan.tok_start[t])
        offsets.append(np.arange(len(kb)))
    text = np.frombuffer(b"".join(kb for _, kb in keys), dtype=np.uint8)
    # one gather for all key bytes: [lines, total key length]
    pos = np.concatenate(
        [s[:, None] + o[None, :] for s, o in zip(starts, offsets, strict=True)], axis=1
    )
    np.minimum(pos, buf.size - 1, out=pos)
    ok &= (buf[pos] == text[None, :]).all(axis=1)
    return ok


def _ints(scan: Scan, t: np.ndarray, *, allow_minus: bool) -> tuple[np.ndarray, np.ndarray]:
    """Integer values of tokens ``t`` and whether each is one (digits, optional minus)."""
    buf = scan.buf
    last = buf.size - 1
    s, e = scan.tok_start[t], scan.tok_end[t]
    if allow_minus:
        minus = buf[s] == ord("-")
        s = s + minus
    length = e - s
    valid = (length > 0) & (length <= _MAX_INT_DIGITS)
    width = int(length.max()) if length.size else 0
    dtype = np.int64 if width > 9 else np.int32
    value = np.zeros(s.size, dtype=dtype)
    for j in range(width):
        d = buf[np.minimum(s + j, last)].astype(dtype) - ord("0")
        inside = j < length
        valid &= ~inside | ((d >= 0) & (d <= 9))
        value = np.where(inside, value * 10 + d, value)
    value = value.astype(np.int64)
    if allow_minus:
        value = np.where(minus, -value, value)
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
        out[ok] = texts[ok].astype(np.float64)
        return out, ok
