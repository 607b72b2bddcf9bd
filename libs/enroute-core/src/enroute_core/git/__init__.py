"""Pure Git formats and codecs: objects, pkt-line, zlib, deltas, pack entries.

No I/O: random-access formats read through :class:`ByteSource`; stream formats
are push parsers.
"""
