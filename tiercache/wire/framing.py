"""Messages with one large ``bytes`` field, written and read without protobuf's copies of that field.

A byte-stream piece (``StreamStoreMessage``, ``StreamLoadMessage``) is a few small fields plus ``data``, up
to several MiB. Through protobuf, that data is copied three times on the way out (into a ``bytes`` object,
into the message, out of it when serializing) and twice on the way in (when parsing, and again on every
read of the field). The wire format allows better: a message may be written as the concatenation of its
serialized parts (fields come in any order, and for a singular field the last occurrence wins), so

- :meth:`Framed.serialize` writes the small fields with protobuf and appends the data field's tag, length
  and bytes, in one copy from the data's buffer (a tensor, a shared-memory slot);
- :func:`split` finds the data field in the received bytes, parses everything else with protobuf, and
  gives the data as a memoryview into the received bytes (no copy).

Both produce and accept exactly the protobuf wire format: any conforming writer can talk to :func:`split`
(it falls back to protobuf's own parser on anything unusual, such as groups), and any conforming reader can
read :meth:`Framed.serialize`'s output.

Primitives:
    Framed: a header message (the small fields) and the data; ``serialize``, ``message``.
    split: wire bytes -> :class:`Framed`, the data as a view into them.
    data_field_number: the number of a message type's ``data`` field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from google.protobuf.message import DecodeError, Message

M = TypeVar("M", bound=Message)
BytesLike = bytes | bytearray | memoryview
"""What a :class:`Framed` data can be: any contiguous bytes-like object."""

_LEN = 2  # wire type of a length-delimited field
_FIXED = {1: 8, 5: 4}  # wire type -> bytes of a fixed-width field
_MAX_VARINT_BYTES = 10


def data_field_number(message_type: type[Message]) -> int:
    """The field number of ``message_type``'s ``data`` field (a ``bytes`` field).

    Raises:
        ValueError: the type has no ``bytes`` field named ``data``.
    """
    field = message_type.DESCRIPTOR.fields_by_name.get("data")
    if field is None or field.type != field.TYPE_BYTES:
        raise ValueError(f"{message_type.DESCRIPTOR.full_name} has no bytes field named data")
    return int(field.number)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class Framed(Generic[M]):
    """A message as its small fields (``header``, with its own ``data`` unset) and its ``data``.

    Attributes:
        header: the message without its data (the other fields).
        data: the data field's bytes (a memoryview into a larger buffer when received).
        more: further bytes of the data field, after ``data``: a piece gathered from several buffers (an
            engine's per-layer tensors) is written in the same one copy, never staged. Always empty in a
            received message (:func:`split`).
    """

    header: M
    data: BytesLike
    more: tuple[BytesLike, ...] = ()

    def serialize(self) -> bytes:
        """The wire bytes of the whole message: the header's, then the data field (one copy of the data)."""
        head = self.header.SerializeToString()
        parts = [memoryview(part) for part in (self.data, *self.more)]
        nbytes = sum(part.nbytes for part in parts)
        if not nbytes:
            return head
        number = data_field_number(type(self.header))
        prefix = _varint(number << 3 | _LEN) + _varint(nbytes)
        return b"".join((head, prefix, *parts))

    def message(self) -> M:
        """The whole message as a protobuf object (copies the data: for tests and small messages)."""
        msg: Any = type(self.header)()
        msg.CopyFrom(self.header)
        msg.data = b"".join([memoryview(part) for part in (self.data, *self.more)])
        return cast(M, msg)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, len(raw))):
        byte = raw[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise DecodeError("truncated or overlong varint")


def _fallback(raw: bytes, message_type: type[M]) -> Framed[M]:
    """Parse with protobuf alone (copies the data): for encodings the fast path leaves to protobuf."""
    msg: Any = message_type.FromString(raw)
    data = bytes(msg.data)
    msg.ClearField("data")
    return Framed(msg, memoryview(data))


def split(raw: bytes, message_type: type[M]) -> Framed[M]:
    """Read one wire message of ``message_type``: its data as a view into ``raw``, the rest parsed.

    Every occurrence of the data field is cut out; the last one is the value (protobuf's rule for a
    singular field). Group fields (long deprecated) and unknown wire types go to protobuf's own parser,
    which decides.

    Raises:
        google.protobuf.message.DecodeError: ``raw`` is not a valid encoding of the message.
    """
    number = data_field_number(message_type)
    end = len(raw)
    pos = 0
    keep: list[tuple[int, int]] = []  # spans of the other fields
    data: tuple[int, int] | None = None
    while pos < end:
        start = pos
        tag, pos = _read_varint(raw, pos)
        wire = tag & 7
        if tag >> 3 == 0:
            return _fallback(raw, message_type)
        if wire == 0:
            _, pos = _read_varint(raw, pos)
        elif wire in _FIXED:
            pos += _FIXED[wire]
        elif wire == _LEN:
            length, pos = _read_varint(raw, pos)
            if tag >> 3 == number:
                data = (pos, pos + length)
                pos += length
                if pos > end:
                    raise DecodeError("truncated data field")
                continue
            pos += length
        else:
            return _fallback(raw, message_type)
        if pos > end:
            raise DecodeError("truncated field")
        if keep and keep[-1][1] == start:
            keep[-1] = (keep[-1][0], pos)
        else:
            keep.append((start, pos))
    view = memoryview(raw)
    whole = len(keep) == 1 and keep[0] == (0, end)
    rest = raw if whole else b"".join(view[a:b] for a, b in keep)
    header = message_type.FromString(rest)
    return Framed(header, view[data[0] : data[1]] if data is not None else view[0:0])
