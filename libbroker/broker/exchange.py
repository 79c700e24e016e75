"""One broker connection's conversation, as a pure state machine: events in, commands out.

h11's and mitmproxy's way: this module decides, its caller (the pump in
:mod:`libbroker.broker.connection`) moves bytes and processes and reports what
happened.  Nothing here touches a socket, a pipe or a process, so every rule
is tested as a script of events and the exact commands they produce
(tests/broker/test_exchange.py).

The rules (docs/DESIGN.md 2.2):

- a peer of another uid is refused;
- the first frame must be a request, and there is only one;
- a request is refused while the audit log is broken (ping excepted: it runs
  nothing);
- ping answers exit 0; exec and sign spawn, and a spawn that fails is refused;
- stdin EOF closes the command's stdin; a signal frame reaches its group while
  it runs;
- the command's exit ends the conversation: its group is killed, then the exit
  frame (after the output still in the pipes, and a line per limit it hit);
- the client going away kills the command's group;
- every connection leaves exactly one audit line; every ending half-closes.

States::

    AWAITING_REQUEST --request--> STARTING --spawned--> RUNNING --exit--> DONE
           |  ping / refusal          | spawn failed        | refusal,
           v                          v                     | client gone
          DONE                       DONE                   v
                                                         ENDING --exit--> DONE

ENDING: all said (or nobody left to say it to), the command killed but not
yet reaped.  DONE: all said and no command running.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from libbroker.errors import ProtocolError, RequestRefused
from libbroker.wire import Channel, Data, Frame, Payload, Request, decode_signal, parse_request


class State(enum.Enum):
    """Where the conversation stands."""

    AWAITING_REQUEST = "awaiting request"
    STARTING = "starting"  # Spawn commanded; the pump answers Spawned or SpawnFailed
    RUNNING = "running"
    ENDING = "ending"  # all said, the killed command not yet reaped
    DONE = "done"


# --- events: what the pump reports ------------------------------------------


@dataclass(frozen=True, slots=True)
class Opened:
    """A client connected; its credentials (SO_PEERCRED) and ours."""

    peer_pid: int
    peer_uid: int
    server_uid: int


@dataclass(frozen=True, slots=True)
class RequestFrame:
    """A request frame's payload (not yet parsed)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class StdinData:
    """The header of a stdin frame with ``size`` payload bytes (the pump moves them)."""

    size: int


@dataclass(frozen=True, slots=True)
class StdinEof:
    """An empty stdin frame: the client's stdin ended."""


@dataclass(frozen=True, slots=True)
class SignalFrame:
    """A signal frame's payload (not yet decoded)."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class BadFrame:
    """The client sent bytes that are not a frame it may send (wire's message)."""

    message: str


@dataclass(frozen=True, slots=True)
class AuditBroken:
    """The audit log cannot be written (reported just before a request)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Spawned:
    """The command asked for by :class:`Spawn` started."""


@dataclass(frozen=True, slots=True)
class SpawnFailed:
    """It did not: cwd outside the workdir, key not enabled, no such program..."""

    message: str


@dataclass(frozen=True, slots=True)
class ChildExited:
    """The command was reaped: ``code`` as ``os.waitstatus_to_exitcode`` gives it
    (-N for signal N), and each limit it hit."""

    code: int
    limits_hit: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClientGone:
    """The client hung up (or its socket failed)."""


@dataclass(frozen=True, slots=True)
class RequestTimeout:
    """No request came within ``seconds``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The server is stopping."""


@dataclass(frozen=True, slots=True)
class InternalError:
    """A bug met on this connection (the exception's class name)."""

    name: str


Event = (
    Opened | RequestFrame | StdinData | StdinEof | SignalFrame | BadFrame | AuditBroken
    | Spawned | SpawnFailed | ChildExited | ClientGone | RequestTimeout | Shutdown
    | InternalError
)  # fmt: skip


# --- commands: what the pump does --------------------------------------------


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start ``request``'s command (op exec in the sandbox, op sign the host's gpg)."""

    request: Request


@dataclass(frozen=True, slots=True)
class Refuse:
    """Send an error frame carrying ``message`` (the last frame)."""

    message: str


@dataclass(frozen=True, slots=True)
class DeliverSignal:
    """Send ``signum`` to the command's process group."""

    signum: int


@dataclass(frozen=True, slots=True)
class CloseStdin:
    """Close the command's stdin pipe (if it has one still open)."""


@dataclass(frozen=True, slots=True)
class SendExit:
    """Send what the output pipes still hold, then ``stderr`` lines, then the exit frame."""

    status: int
    stderr: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KillGroup:
    """Kill the command's whole process group (SIGKILL)."""


@dataclass(frozen=True, slots=True)
class AuditLine:
    """Write one audit line with ``fields``."""

    fields: dict[str, object]


@dataclass(frozen=True, slots=True)
class HalfClose:
    """All said: stop reading the command's output and, once the queue is sent, shut
    our writing side; what the client still sends is discarded until it hangs up."""


@dataclass(frozen=True, slots=True)
class Close:
    """Close the socket now, without waiting for the client to hang up."""


Command = (
    Spawn | Refuse | DeliverSignal | CloseStdin | SendExit | KillGroup | AuditLine
    | HalfClose | Close
)  # fmt: skip


def from_wire(event: Frame | Payload | Data) -> Event:
    """The exchange's event for a client frame decoded by :class:`libbroker.wire.Reader`
    (stdin being its one passthrough channel)."""
    if isinstance(event, Payload):
        return StdinData(event.size)
    if isinstance(event, Data):
        raise ValueError("stdin payloads are moved by the pump, never fed to its reader")
    if event.channel == Channel.REQUEST:
        return RequestFrame(event.payload)
    if event.channel == Channel.SIGNAL:
        return SignalFrame(event.payload)
    return StdinEof()  # a stdin frame that was not announced is the empty one


class Exchange:
    """The server side of one connection's conversation."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = State.AWAITING_REQUEST
        self.request: Request | None = None
        self._clock = clock
        self._started = clock()
        self._peer = (0, 0)
        self._audit_broken: str | None = None

    def handle(self, event: Event) -> list[Command]:
        """The commands ``event`` calls for, in the order they are to be carried out."""
        match event:
            case Opened():
                return self._opened(event)
            case RequestFrame():
                return self._request(event)
            case StdinData():
                return self._stdin_data(event)
            case StdinEof():
                return self._stdin_eof(event)
            case SignalFrame():
                return self._signal(event)
            case BadFrame():
                return self._bad_frame(event)
            case AuditBroken():
                return self._audit_broken_now(event)
            case Spawned():
                return self._spawned(event)
            case SpawnFailed():
                return self._spawn_failed(event)
            case ChildExited():
                return self._child_exited(event)
            case ClientGone():
                return self._client_gone(event)
            case RequestTimeout():
                return self._request_timeout(event)
            case Shutdown():
                return self._shutdown(event)
            case InternalError():
                return self._internal_error(event)
            case _:
                assert_never(event)

    @property
    def talking(self) -> bool:
        """Whether the conversation is open: nothing final said, the client still there."""
        return self.state in (State.AWAITING_REQUEST, State.STARTING, State.RUNNING)

    # --- the client's side ---------------------------------------------------

    def _opened(self, event: Opened) -> list[Command]:
        self._peer = (event.peer_pid, event.peer_uid)
        if event.peer_uid != event.server_uid:
            return self._refuse(f"peer uid {event.peer_uid} is not the server's uid "
                                f"{event.server_uid}")  # fmt: skip
        return []

    def _request(self, event: RequestFrame) -> list[Command]:
        if self.state is not State.AWAITING_REQUEST:
            return self._protocol_error("only one request per connection")
        try:
            self.request = request = parse_request(event.payload)
        except RequestRefused as exc:
            return self._refuse(str(exc))
        if request.op == "ping":  # runs nothing: answered even with the audit log broken
            return self._finish([SendExit(0)], exit=0)
        if self._audit_broken is not None:
            return self._refuse(f"the audit log cannot be written ({self._audit_broken}): "
                                "refusing to run unaudited")  # fmt: skip
        self.state = State.STARTING
        return [Spawn(request)]

    def _stdin_data(self, event: StdinData) -> list[Command]:
        # Where the bytes go (the command's stdin, or nowhere when it has none
        # or closed it) is the pump's business; only their place is decided here.
        return [] if self.state is State.RUNNING else self._before_request()

    def _stdin_eof(self, event: StdinEof) -> list[Command]:
        return [CloseStdin()] if self.state is State.RUNNING else self._before_request()

    def _signal(self, event: SignalFrame) -> list[Command]:
        if self.state is not State.RUNNING:
            return self._before_request()
        try:
            return [DeliverSignal(decode_signal(event.payload))]
        except ProtocolError as exc:
            return self._protocol_error(str(exc))

    def _bad_frame(self, event: BadFrame) -> list[Command]:
        return self._protocol_error(event.message)

    def _client_gone(self, event: ClientGone) -> list[Command]:
        if not self.talking:
            return []
        return self._finish([], exit=None, client_gone=True)

    # --- the server's side ---------------------------------------------------

    def _audit_broken_now(self, event: AuditBroken) -> list[Command]:
        self._audit_broken = event.reason
        return []

    def _spawned(self, event: Spawned) -> list[Command]:
        self._expect(State.STARTING)
        self.state = State.RUNNING
        return []

    def _spawn_failed(self, event: SpawnFailed) -> list[Command]:
        self._expect(State.STARTING)
        return self._refuse(event.message)

    def _child_exited(self, event: ChildExited) -> list[Command]:
        # The command is over: so is anything it left running in its group.
        if self.state is State.ENDING:
            self.state = State.DONE
            return [KillGroup()]
        self._expect(State.RUNNING)
        self.state = State.DONE
        status = 128 - event.code if event.code < 0 else event.code  # the shell's rule
        # A limit hit is an ordinary event the caller should hear of, on stderr.
        notes = tuple(f"broker: the command hit its {hit}\n" for hit in event.limits_hit)
        # The audit line goes before the exit frame: once the client has its
        # status it may be gone, and whoever reads the log then must find it.
        audit, half_close = self._said_all(exit=status)
        return [KillGroup(), CloseStdin(), audit, SendExit(status, notes), half_close]

    def _request_timeout(self, event: RequestTimeout) -> list[Command]:
        if self.state is not State.AWAITING_REQUEST:
            return []
        return self._refuse(f"no request within {event.seconds:.0f} s")

    def _shutdown(self, event: Shutdown) -> list[Command]:
        if self.state in (State.RUNNING, State.ENDING):
            return [KillGroup()]  # a running command's exit frame still goes out
        if self.state is State.DONE:
            return [Close()]  # all said already: no need to wait for the hang-up
        return self._refuse("the broker is shutting down")

    def _internal_error(self, event: InternalError) -> list[Command]:
        if not self.talking:
            return [Close()]
        return self._refuse(f"internal error: {event.name}")

    # --- endings -------------------------------------------------------------

    def _before_request(self) -> list[Command]:
        """A stdin or signal frame: refused before the request, ignored once all is said."""
        if self.state is State.AWAITING_REQUEST:
            return self._protocol_error("the first frame must be a request")
        return []

    def _protocol_error(self, message: str) -> list[Command]:
        """Refuse a frame out of place; once all is said, frames no longer matter."""
        if not self.talking:
            return []
        return self._refuse(f"protocol error: {message}")

    def _refuse(self, message: str) -> list[Command]:
        return self._finish([Refuse(message)], refused=message)

    def _finish(self, said: list[Command], **outcome: object) -> list[Command]:
        """End the conversation early: a running command is stopped and reaped later."""
        if self.state is State.RUNNING:
            said = [*said, CloseStdin(), KillGroup()]
            self.state = State.ENDING
        else:
            self.state = State.DONE
        return [*said, *self._said_all(**outcome)]

    def _said_all(self, **outcome: object) -> list[Command]:
        """Every ending: exactly one audit line, then the half-close."""
        return [AuditLine(self._audit_fields(outcome)), HalfClose()]

    def _audit_fields(self, outcome: dict[str, object]) -> dict[str, object]:
        request = self.request
        fields: dict[str, object] = {
            "peer_pid": self._peer[0],
            "peer_uid": self._peer[1],
            "op": request.op if request else None,
            "argv": list(request.argv) if request else None,
            "cwd": request.cwd if request else None,
            "duration": round(self._clock() - self._started, 6),
        }
        if request is not None and request.key is not None:
            fields["key"] = request.key
        fields.update(outcome)
        return fields

    def _expect(self, state: State) -> None:
        if self.state is not state:
            raise RuntimeError(f"pump bug: event in state {self.state.value}, not {state.value}")
