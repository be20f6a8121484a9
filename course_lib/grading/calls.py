"""The grader's calls into a kernel: one request, one answer of data, bounded in time and size.

:class:`KernelCalls` sends a request (:mod:`course_lib.grading.kernel_side`: call a function of the
notebook, evaluate an expression, run a grader-written check) as an ``execute_request`` that stores
nothing in the notebook's history, and reads the answer from the reply's ``user_expressions``
(:func:`course_lib.grading.wire.parse_answer`: type-checked data, never evaluated or unpickled).
It times the request from the grader's side, request sent to reply received.

A request that runs past its time is interrupted (:class:`CallError`); one that ignores the interrupt
or whose kernel dies raises :class:`KernelLostError`, and the kernel must be replaced. The output a call
prints is discarded, at most :attr:`KernelCalls.max_drain_messages` messages of it.

References
----------
Jupyter messaging specification 5.4: ``execute_request`` (``store_history``, ``user_expressions``,
``stop_on_error``), ``interrupt_request``, IOPub ``status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from queue import Empty
from typing import Any

from jupyter_core.utils import run_sync

from course_lib.grading.wire import Answer, MalformedAnswerError, parse_answer, to_wire

__all__ = ["CallError", "KernelCalls", "KernelLostError", "Outcome"]

_MODULE = "course_lib.grading.kernel_side"


class CallError(Exception):
    """A request that brought back no answer. ``reason`` may be shown to the student; ``detail`` not."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


class KernelLostError(CallError):
    """The kernel died or ignored the interrupt: it must be replaced before anything else runs."""


@dataclass(frozen=True)
class Outcome:
    """One request's answer and its wall time from the grader's side, seconds."""

    answer: Answer
    elapsed_s: float


class KernelCalls:
    """Requests into one kernel through its manager ``km`` and client ``kc`` (both asynchronous).

    Parameters
    ----------
    km, kc
        jupyter_client ``AsyncKernelManager`` and ``AsyncKernelClient`` with started channels.
    max_answer_bytes : int
        Largest answer accepted, bytes of JSON (the kernel side also refuses to send more).
    interrupt_grace_s : float
        How long an interrupted request may take to answer before the kernel counts as hung.
    """

    max_drain_messages = 10_000

    def __init__(
        self, km, kc, *, max_answer_bytes: int = 8 * 1024**2, interrupt_grace_s: float = 5.0
    ) -> None:
        self.km, self.kc = km, kc
        self.max_answer_bytes = max_answer_bytes
        self.interrupt_grace_s = interrupt_grace_s

    async def request(
        self,
        op: str,
        *,
        target: str | None = None,
        source: str | None = None,
        args: tuple | list = (),
        kwargs: dict | None = None,
        timeout_s: float,
        asynchronous: bool = False,
        return_args: bool = False,
    ) -> Outcome:
        """Send one request and wait at most ``timeout_s`` for its answer.

        Parameters
        ----------
        op : {"call", "eval", "run"}
            Call ``target`` (a name or dotted path in the notebook), evaluate the expression
            ``source``, or run ``source``'s ``check(ns, *args, **kwargs)``.
        timeout_s : float > 0
            Seconds until the request is interrupted.
        asynchronous : bool
            The call returns an awaitable (an ``async def`` function, an ``async def check``): await
            it at the top level. A blocking call cannot be interrupted there, so it ends as
            :class:`KernelLostError`.
        return_args : bool
            (``call`` only) answer ``(result, args)`` with the arguments as they are after the
            call, to check that the function did not change its inputs.

        Raises
        ------
        CallError
            Timed out, or the kernel sent no well-formed answer.
        KernelLostError
            The kernel died, or ignored the interrupt.
        """
        nonce = secrets.token_hex(16)
        body: dict[str, Any] = {
            "nonce": nonce,
            "op": op,
            "args": to_wire(list(args)),
            "kwargs": to_wire(dict(kwargs or {})),
            "max_bytes": self.max_answer_bytes,
        }
        if target is not None:
            body["target"] = target
        if source is not None:
            body["source"] = source
        if return_args:
            body["return_args"] = True
        serve = "serve_async" if asynchronous else "serve"
        code = f"__import__({_MODULE!r}, fromlist=[{serve!r}]).{serve}({json.dumps(body)!r})"
        code = f"await {code}" if asynchronous else code
        take = f"__import__({_MODULE!r}, fromlist=['take']).take({nonce!r})"
        start = time.perf_counter()
        msg_id = self.kc.execute(
            code,
            silent=False,
            store_history=False,
            user_expressions={"answer": take},
            allow_stdin=False,
            stop_on_error=False,
        )
        reply = await self._reply(msg_id, timeout_s)
        elapsed = time.perf_counter() - start
        if reply is None:
            await self.km.interrupt_kernel()
            reply = await self._reply(msg_id, self.interrupt_grace_s)
            if reply is None:
                raise KernelLostError(
                    f"ran past its {timeout_s:g} s and ignored the interrupt",
                    "no execute_reply after interrupt_request",
                )
            await self._drain(msg_id)
            raise CallError(f"took longer than {timeout_s:g} s", "interrupted")
        await self._drain(msg_id)
        return Outcome(self._answer(reply), elapsed)

    request_sync = run_sync(request)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """This kernel's processes stopped for the block, when its manager can (a sandboxed kernel's)."""
        pause = getattr(self.km, "paused", None)
        if pause is None:
            yield
            return
        with pause():
            yield

    def _answer(self, reply: dict) -> Answer:
        content = reply.get("content")
        if not isinstance(content, dict) or content.get("status") != "ok":
            ename = content.get("ename", "?") if isinstance(content, dict) else "?"
            raise CallError("could not be run (the kernel reported an error)", f"status error: {ename}")
        expression = (content.get("user_expressions") or {}).get("answer")
        if not isinstance(expression, dict) or expression.get("status") != "ok":
            raise CallError("sent no answer", f"user expression: {str(expression)[:200]}")
        text = (expression.get("data") or {}).get("text/plain")
        try:
            return parse_answer(text, max_bytes=self.max_answer_bytes)
        except MalformedAnswerError as error:
            raise CallError("sent an answer that is not well-formed data", str(error)) from None

    async def _reply(self, msg_id: str, timeout_s: float) -> dict | None:
        """The shell reply to ``msg_id``, or None after ``timeout_s``; raises KernelLostError if it died."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        while (remaining := deadline - loop.time()) > 0:
            try:
                msg = await self.kc.shell_channel.get_msg(timeout=min(remaining, 0.5))
            except Empty:
                if not await self.km.is_alive():
                    raise KernelLostError(
                        "ended the kernel (it died during the call)", "process exited"
                    ) from None
                continue
            except Exception:
                continue
            if isinstance(msg, dict) and (msg.get("parent_header") or {}).get("msg_id") == msg_id:
                return msg
        return None

    async def _drain(self, msg_id: str, timeout_s: float = 2.0) -> None:
        """Read (and drop) IOPub messages until ``msg_id``'s ``idle`` status or ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for _ in range(self.max_drain_messages):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                msg = await self.kc.iopub_channel.get_msg(timeout=remaining)
            except Empty:
                return
            except Exception:
                continue
            if (
                isinstance(msg, dict)
                and msg.get("msg_type") == "status"
                and (msg.get("parent_header") or {}).get("msg_id") == msg_id
                and (msg.get("content") or {}).get("execution_state") == "idle"
            ):
                return
