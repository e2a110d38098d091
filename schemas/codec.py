"""One encoder and one typed decoder per event type (msgpack on the wire)."""

from __future__ import annotations

from functools import cache
from typing import TypeVar

import msgspec

from schemas.events import Event

E = TypeVar("E", bound=msgspec.Struct)

_encoder = msgspec.msgpack.Encoder()


def encode(event: msgspec.Struct) -> bytes:
    return _encoder.encode(event)


@cache
def decoder(event_type: type[E]) -> msgspec.msgpack.Decoder[E]:
    return msgspec.msgpack.Decoder(event_type)


def decode(data: bytes, event_type: type[E]) -> E:
    """Strict decode; raises `msgspec.ValidationError` naming the offending field."""
    return decoder(event_type).decode(data)


__all__ = ["encode", "decode", "decoder", "Event", "DecodeError"]
DecodeError = (msgspec.ValidationError, msgspec.DecodeError)
