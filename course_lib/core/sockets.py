"""A connection's socket as the kernel sees it, under an asyncio transport: peek, end the stream now.

An event loop learns what happened to a connection one loop pass after the kernel does. Two questions
cannot wait for that pass: a server about to close an idle connection asks whether a request has just
arrived (it would be dropped with a reset), and a client about to reuse an idle connection asks whether
the server has just closed it (its request would be lost). Both are answered by the kernel at once,
on the transport's own descriptor, without reading anything the loop has not read:

* :func:`readable`: ``poll(0)``: something waits to be read (bytes, an end of stream or an error):
  the cheap question (0.6 us, against 3 us for a peek through a socket object), enough for "has
  anything happened on this idle connection?";
* :func:`peek`: ``recv(1, MSG_PEEK | MSG_DONTWAIT)``: ``"bytes"`` (unread bytes wait), ``"nothing"``
  (the peer is there, silent), ``"end"`` (the peer shut down its side: 0 bytes) or ``"reset"`` (an
  error, or no socket): tells an end of stream from a request;
* :func:`end_stream_now`: ``shutdown(SHUT_WR)``: the peer sees the end of stream now, not when the
  transport closes the socket a loop pass later; never while an answer is still in the transport's
  buffer (``transport.close`` sends that first; a shutdown would cut it short).

The descriptor is wrapped without ``dup`` (family and type given: no syscalls to find them) and
detached afterwards, never closed: it stays the transport's. TCP sockets only (AF_INET, as the course's
servers and clients on 127.0.0.1).

References
----------
Linux ``recv(2)`` (``MSG_PEEK``, ``MSG_DONTWAIT``; 0 bytes means the peer shut down its side) and
``shutdown(2)``. urllib3, ``util/wait.py`` and ``connection.is_connection_dropped`` (a pooled
connection is checked before it is reused). RFC 9112 section 9.3.1 (a kept-alive connection may close
at any time; a client that sent a request on it cannot know whether it was read).
"""

from __future__ import annotations

import asyncio
import select
import socket
from typing import cast

__all__ = ["end_stream_now", "peek", "readable"]


def _descriptor(transport: asyncio.BaseTransport | None) -> int:
    raw = transport.get_extra_info("socket") if transport is not None else None
    return raw.fileno() if raw is not None else -1


def readable(transport: asyncio.BaseTransport | None) -> bool:
    """True if bytes, an end of stream or an error wait on ``transport``'s connection (or it has no socket).

    Never raises.
    """
    fd = _descriptor(transport)
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def peek(transport: asyncio.BaseTransport | None) -> str:
    """What the kernel holds for ``transport``'s socket: ``"bytes"``, ``"nothing"``, ``"end"`` or ``"reset"``.

    ``"reset"`` also for a transport without a socket (closed, or none). Never raises.
    """
    fd = _descriptor(transport)
    if fd < 0:
        return "reset"
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fd)
    try:
        return "bytes" if probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) else "end"
    except BlockingIOError:
        return "nothing"
    except OSError:
        return "reset"
    finally:
        probe.detach()


def end_stream_now(transport: asyncio.BaseTransport | None) -> None:
    """Send the end of stream (FIN) on ``transport``'s connection now; its closing stays the transport's.

    Does nothing for a transport without a socket or one already shut down, and nothing while the
    transport still holds bytes to send (an answer to a slow reader: ``transport.close`` sends them
    first, and a shutdown now would end the stream in the middle of them). Never raises.
    """
    fd = _descriptor(transport)
    if fd < 0 or cast(asyncio.WriteTransport, transport).get_write_buffer_size():
        return
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fd)
    try:
        probe.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        probe.detach()
