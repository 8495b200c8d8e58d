"""Requests whose form depends on what the daemon said, at registration, that it reads.

A newer client may meet an older daemon (and the reverse): a request field the daemon does not know would
be dropped unread, so a client uses one only when the namespace's current
:class:`~.results.Registration` says the daemon reads it, and otherwise sends the older form. The request is
built again from the new registration when a call is retried after re-registration (the daemon may have been
replaced by another version meanwhile): see :meth:`~.connection.Connection.unary_registered`.

Primitives:
    lookup_request: a LookupRequest with the keys packed into one field when the daemon reads them so
        (:mod:`tiercache.keychain`), else as the repeated field.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiercache.keychain import PackedKeys
from tiercache.proto import tiercache_pb2 as pb

from .results import Registration


def lookup_request(reg: Registration | None, keys: Sequence[bytes], prefetch: bool) -> pb.LookupRequest:
    """The LookupRequest of ``keys`` for the daemon of ``reg``.

    Raises:
        InvalidArgumentError: a key is not 32 bytes (``keys[i]``), or ``keys`` is a single bytes value.
    """
    if reg is None:
        raise ValueError("a lookup names a registered namespace")
    packed = PackedKeys.pack(keys)  # checked here, either way: the daemon would refuse the request anyway
    if reg.packed_keys:
        return pb.LookupRequest(handle=reg.handle, packed_keys=packed.data, prefetch=prefetch)
    return pb.LookupRequest(handle=reg.handle, keys=keys, prefetch=prefetch)
