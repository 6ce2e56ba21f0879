"""Per-token NPZ traces (``.npz``): the reader (:mod:`.read`, which registers the format
and streams tokens), the archive's members read safely (:mod:`.members`) and the writer
(:mod:`.write`)."""

from placer.traces.formats.npz import read
from placer.traces.formats.npz.members import META_KEYS, read_member
from placer.traces.formats.npz.read import NpzTokens, read_npz_header
from placer.traces.formats.npz.write import write_npz_trace

__all__ = ["META_KEYS", "NpzTokens", "read", "read_member", "read_npz_header",
           "write_npz_trace"]
