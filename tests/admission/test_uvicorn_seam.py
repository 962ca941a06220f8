"""The private parts of uvicorn the webhook's server relies on (``kernelbake.admission.http._uvicorn``).

When a uvicorn release renames or drops one of them, this fails naming it; the server tests
would fail too, but somewhere in a TLS exchange.
"""

from __future__ import annotations

import asyncio
import inspect

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from kernelbake.admission.http._uvicorn import PRIVATE_ATTRIBUTES, PRIVATE_CALLBACKS, bounded_protocol


async def _app(scope: object, receive: object, send: object) -> None:
    return None


def test_the_callbacks_the_bounded_protocol_extends_exist() -> None:
    for name in PRIVATE_CALLBACKS:
        assert callable(getattr(HttpToolsProtocol, name, None)), (
            f"uvicorn's HttpToolsProtocol has no {name}()"
        )
        # The override is called with the arguments uvicorn's own method takes.
        ours = inspect.signature(getattr(bounded_protocol(idle=1, arriving=1, head_limit=1), name))
        theirs = inspect.signature(getattr(HttpToolsProtocol, name))
        assert list(ours.parameters) == list(theirs.parameters), name


def test_the_attributes_it_reads_are_set_by_uvicorn() -> None:
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(_app, lifespan="off", log_config=None)
        config.load()
        protocol = bounded_protocol(idle=1, arriving=1, head_limit=1)(
            config=config, server_state=ServerState(), app_state={}, _loop=loop
        )
        # Set by the constructor, or (``url``) by a callback: assigned in the class either way.
        source = inspect.getsource(HttpToolsProtocol)
        missing = [n for n in PRIVATE_ATTRIBUTES if not hasattr(protocol, n) and f"self.{n} =" not in source]
        assert not missing, f"uvicorn's HttpToolsProtocol no longer sets {missing}"
    finally:
        loop.close()


def test_bounds_travel_as_class_attributes() -> None:
    cls = bounded_protocol(idle=2.5, arriving=0.5, head_limit=10)
    assert (cls.idle_seconds, cls.arriving_seconds, cls.head_limit) == (2.5, 0.5, 10)
    assert issubclass(cls, HttpToolsProtocol)


def test_asyncio_builds_each_accepted_tls_connection_from_the_class_bound_tls_replaces() -> None:
    # ``bound_tls`` swaps ``asyncio.sslproto.SSLProtocol``: that works only while asyncio looks
    # the class up in its module at each accept, reads the buffer size from ``max_size`` and
    # takes the arguments BoundedTLS passes on.
    import asyncio.selector_events
    import asyncio.sslproto

    from kernelbake.admission.http._uvicorn import BoundedTLS

    # asyncio's own class (a server started in this process has swapped the module's name).
    (original,) = BoundedTLS.__bases__
    assert original.__module__ == "asyncio.sslproto"
    assert asyncio.sslproto.SSLProtocol in (original, BoundedTLS)
    assert "sslproto.SSLProtocol(" in inspect.getsource(asyncio.selector_events)
    assert "bytearray(self.max_size)" in inspect.getsource(original.__init__)
    ours = inspect.signature(BoundedTLS.__init__)
    theirs = inspect.signature(original.__init__)
    assert list(ours.parameters) == list(theirs.parameters)


def test_what_bounded_tls_reads_and_overrides_of_asyncio_exists() -> None:
    # BoundedTLS breaks a failed handshake's reference cycles through these (issue 41 item 1).
    import asyncio.sslproto

    from kernelbake.admission.http._uvicorn import BoundedTLS

    (original,) = BoundedTLS.__bases__
    assert list(inspect.signature(original._wakeup_waiter).parameters) == ["self", "exc"]
    assert "self._waiter.set_exception(exc)" in inspect.getsource(original._wakeup_waiter)
    source = inspect.getsource(original.__init__)
    for attribute in ("self._server_side =", "self._app_state =", "self._set_app_protocol("):
        assert attribute in source, f"asyncio's SSLProtocol no longer sets {attribute}"
    assert asyncio.sslproto.AppProtocolState.STATE_INIT
    # connection_lost clears the app protocol (read before it) and calls the app's
    # connection_lost only once its connection was made.
    lost = inspect.getsource(original.connection_lost)
    assert "self._app_protocol = None" in lost and "AppProtocolState.STATE_CON_MADE" in lost
