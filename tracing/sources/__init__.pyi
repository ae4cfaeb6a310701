"""The names ``tracing.sources`` exports, for type checkers; ``__init__.py`` loads each from the
module named here on first use."""

from ._assemble import (
    DEFAULT_MAX_OPEN_BYTES,
    MAX_SPANS_PER_TRACE,
    AssembledTrace,
    AssemblerStats,
    Released,
    TraceAssembler,
)
from ._base import (
    Malformed,
    Position,
    SourceError,
    SourceItem,
    SpanBatch,
    TraceSource,
    UnitEnd,
)
from ._compressed import (
    DECOMPRESS_ERRORS,
    MAX_BARREN_RECORDS,
    MAX_DECOMPRESSED_BYTES_ENV,
    Opened,
    max_decompressed_bytes,
    open_compressed,
    past_decompressed_cap,
)
from ._files import FileSource
from ._open import open_source, source_from_description
from ._tempo import TempoSource

__all__ = [
    "DECOMPRESS_ERRORS",
    "DEFAULT_MAX_OPEN_BYTES",
    "MAX_BARREN_RECORDS",
    "MAX_DECOMPRESSED_BYTES_ENV",
    "MAX_SPANS_PER_TRACE",
    "AssembledTrace",
    "AssemblerStats",
    "FileSource",
    "Malformed",
    "Opened",
    "Position",
    "Released",
    "SourceError",
    "SourceItem",
    "SpanBatch",
    "TempoSource",
    "TraceAssembler",
    "TraceSource",
    "UnitEnd",
    "max_decompressed_bytes",
    "open_compressed",
    "open_source",
    "past_decompressed_cap",
    "source_from_description",
]
