"""How an :class:`EnrouteError` reaches a Git client, through ``ERROR_TABLE`` only.

STYLE rule 4 and DESIGN "Git protocol": FATAL errors are an ``ERR`` packet
before the response has started (gitprotocol-pack, "Pack Protocol",
``error-line``) and side-band channel 3 after it, when side-band is on
(gitprotocol-capabilities, "side-band, side-band-64k"). REF errors refuse one
ref of a push as ``ng <ref> <reason>`` (gitprotocol-pack, "Report Status").
"""

from __future__ import annotations

from enroute_core.base.errors import EnrouteError, GitForm
from enroute_core.git.pktline import err_pkt
from enroute_core.git.sideband import BAND_ERROR, SIDEBAND_64K_DATA_BYTES_MAX, sideband_pkt

__all__ = ["fatal_error_bytes", "git_message", "ref_reason"]

# A message long enough to explain, short enough for any one packet.
_MESSAGE_BYTES_MAX = 1000


def git_message(exc: EnrouteError) -> bytes:
    """The text a user sees: one line, no control characters, bounded."""
    text = exc.message.encode("utf-8", "replace")
    cleaned = bytes(b if 0x20 <= b != 0x7F else 0x20 for b in text)
    return cleaned[:_MESSAGE_BYTES_MAX]


def fatal_error_bytes(exc: EnrouteError, *, response_started: bool, sideband: bool) -> bytes:
    """The bytes that end a conversation with ``exc``, whatever its Git form.

    A REF-form error that still ends the conversation (a malformed command,
    say) is shown like a FATAL one: no report exists yet to carry an ``ng``.
    """
    message = git_message(exc)
    if response_started and sideband:
        assert len(message) + 1 <= SIDEBAND_64K_DATA_BYTES_MAX
        return sideband_pkt(BAND_ERROR, message + b"\n")
    return err_pkt(message)


def ref_reason(exc: EnrouteError) -> bytes:
    """The ``<reason>`` of ``ng <ref> <reason>`` for a REF-form error.

    Refused for FATAL errors: those end the push instead of one ref.
    """
    assert exc.mapping.git_form is GitForm.REF, f"{exc.code} is not a REF-form error"
    return git_message(exc)
