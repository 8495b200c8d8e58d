"""Registering servicers so that a request the daemon cannot decode answers INVALID_ARGUMENT, never UNKNOWN.

grpc.aio decodes each request message with the method handler's ``request_deserializer``: before the
behaviour runs for a unary request, while the behaviour reads its request stream for a streaming one. An
exception there escapes into the framework, which answers UNKNOWN with the protobuf error's text. So the
servicers are not registered through the generated ``add_*_to_server`` but through handlers built here from
the service descriptor — every method of it, so that a new RPC cannot be left out: each deserializer turns a
``DecodeError`` into an :class:`Undecodable` marker instead of raising, and each behaviour ends the call with
INVALID_ARGUMENT naming the method when it gets the marker as its request, or when its request stream yields
one. Nothing reaches a handler of :mod:`.servicer` or :mod:`.diagnostics` undecoded, and the call's failure
stays the call's: the daemon and other calls carry on. A servicer may give a method its own wire codec
(``WIRE_CODECS``: the byte streams read and write their pieces without protobuf's copies of the data);
its parser raises ``DecodeError`` like protobuf's and gets the same treatment.

Primitives:
    Undecodable: the marker of a request message that could not be decoded.
    WireCodec: a method's own request parser and response writer.
    method_handlers: the grpc method handlers of a servicer for every method of a service descriptor.
    add_servicer: register a servicer on a server for every method of its service descriptor (returns the
        handlers).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A request message that did not decode; it stands in for the request so the call can be refused.

    Attributes:
        method: the full method name, ``package.Service/Method``.
        message_type: the full name of the request message type.
        error: the protobuf decode error's text (logged, not sent: it says nothing a caller can act on).
    """

    method: str
    message_type: str
    error: str


@dataclass(frozen=True, slots=True)
class WireCodec:
    """A method's own wire codec, in place of protobuf's (a servicer's ``WIRE_CODECS`` maps names to them).

    Attributes:
        parse: request bytes -> the request the handler gets; raises ``DecodeError`` when malformed.
        write: a response the handler yields or returns -> its wire bytes.
    """

    parse: Callable[[bytes], Any]
    write: Callable[[Any], bytes]


async def _refuse(context: Any, request: Undecodable) -> NoReturn:
    """End the call with INVALID_ARGUMENT naming the method and the message type it expected."""
    logger.debug("%s: undecodable request: %s", request.method, request.error)
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{request.method}: the request could not be decoded as a {request.message_type}",
    )
    raise AssertionError("context.abort returned")  # pragma: no cover


def _deserializer(
    method: str, message_type: type[Message], parse: Callable[[bytes], Any]
) -> Callable[[bytes], Any]:
    """A request deserializer that returns an :class:`Undecodable` where parsing fails."""
    type_name = message_type.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return Undecodable(method, type_name, str(exc))

    return deserialize


async def _decoded(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    """The messages of a request stream; the call is refused at the first one that did not decode."""
    async for request in requests:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        yield request


def _guarded(method: MethodDescriptor, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    """``behaviour`` behind the decode check of its request (or request stream), keeping its call style.

    Raises:
        TypeError: ``behaviour`` is not an async handler of the method's kind (a coroutine function for a
            unary response, an async generator function for a streaming one).
    """
    name = f"{method.containing_service.full_name}/{method.name}"
    wants_generator = method.server_streaming
    if (
        inspect.isasyncgenfunction(behaviour) != wants_generator
        or inspect.iscoroutinefunction(behaviour) == wants_generator
    ):
        kind = "an async generator function" if wants_generator else "a coroutine function"
        raise TypeError(f"{name}: the servicer's handler must be {kind}")

    if method.client_streaming and method.server_streaming:

        async def stream_stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for response in behaviour(_decoded(requests, context), context):
                yield response

        return stream_stream
    if method.client_streaming:

        async def stream_unary(requests: AsyncIterator[Any], context: Any) -> Any:
            return await behaviour(_decoded(requests, context), context)

        return stream_unary
    if method.server_streaming:

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                await _refuse(context, request)
            async for response in behaviour(request, context):
                yield response

        return unary_stream

    async def unary_unary(request: Any, context: Any) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        return await behaviour(request, context)

    return unary_unary


_HANDLER_KINDS: Mapping[tuple[bool, bool], Callable[..., Any]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
"""(client streaming, server streaming) -> the grpc factory of that kind of method handler."""


def method_handlers(servicer: object, service: ServiceDescriptor) -> dict[str, Any]:
    """The grpc method handlers of ``servicer`` for every method of ``service``, by method name.

    Each handler calls the servicer's attribute of the method's name with decoded requests only.

    Raises:
        TypeError: a method's handler on ``servicer`` is not an async handler of the method's kind (the
            generated base class's UNIMPLEMENTED stubs included: every RPC must be served).
    """
    handlers: dict[str, Any] = {}
    codecs: Mapping[str, WireCodec] = getattr(servicer, "WIRE_CODECS", {})
    for method in service.methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        full_name = f"{service.full_name}/{method.name}"
        factory = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        codec = codecs.get(method.name, WireCodec(request_type.FromString, response_type.SerializeToString))
        handlers[method.name] = factory(
            _guarded(method, getattr(servicer, method.name)),
            request_deserializer=_deserializer(full_name, request_type, codec.parse),
            response_serializer=codec.write,
        )
    return handlers


def add_servicer(server: grpc.aio.Server, servicer: object, service: ServiceDescriptor) -> dict[str, Any]:
    """Serve every method of ``service`` on ``server`` through ``servicer`` (as ``add_*_to_server`` would).

    Returns:
        The method handlers, by method name (the control socket serves the same ones).
    """
    handlers = method_handlers(servicer, service)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
    return handlers
