"""What comes from the client on a broker connection: frames, and stdin spliced into the command.

Part of :class:`libbroker.broker.connection.Connection` (its base): the socket
is read while there is room for what it brings; a stdin payload, announced by
the reader, goes ``splice(socket -> pipe)`` into the command's stdin pipe (or
is copied where the kernel refuses splice); while that pipe is full the loop
watches the pipe for room instead of the socket for data, and polls now and
then for a hang-up it would not see meanwhile.  Every other frame becomes an
event for the exchange.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket

from libbroker.broker.exchange import AuditBroken, BadFrame, Event, from_wire
from libbroker.broker.pipes import SPLICE_FLAGS
from libbroker.errors import ProtocolError
from libbroker.wire import MAX_PAYLOAD, Reader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from libbroker.broker.connection import Settings


class FromClient:
    """The reading side of a connection (the state is set by ``Connection.__init__``)."""

    s: Settings
    loop: asyncio.AbstractEventLoop
    sock: socket.socket
    fd: int
    reader: Reader
    reading: bool
    closed: bool
    ending: bool  # all said: what the client still sends is dropped
    stdin_fd: int | None
    # True while the command's stdin pipe is full: the loop watches the
    # pipe for room instead of the socket for data.
    stdin_stalled: bool
    watchdog: asyncio.TimerHandle | None

    # What the connection brings (libbroker.broker.connection.Connection).
    def _event(self, event: Event) -> None:
        raise NotImplementedError

    def _client_gone(self) -> None:
        raise NotImplementedError

    def _internal_error(self, exc: Exception) -> None:
        raise NotImplementedError

    def _read_socket(self, on: bool) -> None:
        if on and not self.reading and not self.closed:
            self.loop.add_reader(self.fd, self._on_readable)
            self.reading = True
        elif not on and self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _on_readable(self) -> None:
        try:
            for _ in range(64):  # then let the other connections have a turn
                if self.closed or not (self.reading or self.stdin_stalled):
                    return
                if not self._read_step():
                    return
        except ProtocolError as exc:
            self._event(BadFrame(str(exc)))
        except ConnectionError:
            self._client_gone()
        except Exception as exc:  # anything else: end this connection, not the server
            self._internal_error(exc)

    def _read_step(self) -> bool:
        """Make progress on the incoming stream; False when nothing more can be done now."""
        if self.ending:
            return self._discard_step()
        if self.reader.passing:
            return self._stdin_step()
        event = self.reader.next_event()
        if event is not None:
            if self.s.audit.broken is not None:  # the log is shared: report its state first
                self._event(AuditBroken(self.s.audit.broken))
            self._event(from_wire(event))
            return True
        data = self._recv(self.reader.want())
        if data is None:
            return False
        self.reader.feed(data)
        return True

    def _recv(self, count: int) -> bytes | None:
        """Up to ``count`` bytes from the client; None when there are none now or it hung up."""
        try:
            data = self.sock.recv(count)
        except BlockingIOError:
            self._socket_empty()
            return None
        if not data:
            self._client_gone()
            return None
        return data

    def _discard_step(self) -> bool:
        """All said: what the client still sends is read and dropped until it hangs up.

        Closing while the client still sends (stdin) would reset the
        connection, and the client could lose the last frame.
        """
        return self._recv(MAX_PAYLOAD) is not None

    def _stdin_step(self) -> bool:
        """Splice a stdin payload from the socket into the command's stdin pipe."""
        remaining = self.reader.passing
        if self.stdin_fd is None:
            # No stdin asked for, or the command closed it: discard.
            data = self._recv(min(remaining, MAX_PAYLOAD))
            if data is None:
                return False
            moved = len(data)
        elif not self.s.splice:
            return self._stdin_copy_step(remaining)
        else:
            try:
                moved = os.splice(self.fd, self.stdin_fd, remaining, flags=SPLICE_FLAGS)
            except BlockingIOError:
                if self._stdin_full():
                    return self._stall_stdin()
                return self._socket_empty()
            except (BrokenPipeError, ConnectionResetError) as exc:
                if isinstance(exc, ConnectionResetError):
                    raise
                self._close_stdin()  # the command closed its stdin: drop the rest
                return True
            if not moved:
                self._client_gone()
                return False
        self.reader.passed(moved)
        return True

    def _stdin_copy_step(self, remaining: int) -> bool:
        """Without splice: recv and write (blocking the stream while the pipe is full)."""
        assert self.stdin_fd is not None
        if self._stdin_full():
            return self._stall_stdin()
        data = self._recv(min(remaining, 1 << 16))
        if data is None:
            return False
        try:
            os.write(self.stdin_fd, data)  # poll said writable: at least 4 KiB fit (PIPE_BUF)
        except OSError:
            self._close_stdin()
        self.reader.passed(len(data))
        return True

    def _stdin_full(self) -> bool:
        assert self.stdin_fd is not None
        poller = select.poll()
        poller.register(self.stdin_fd, select.POLLOUT)
        return not poller.poll(0)

    def _stall_stdin(self) -> bool:
        """The command's stdin pipe is full: wait for room in it, not for the socket.

        The pipe stays watched until the socket runs dry (:meth:`_socket_empty`):
        a command that reads slowly wakes us once per read, and each wake-up
        goes straight to the next splice, with no re-registering in between.
        """
        if not self.stdin_stalled:
            assert self.stdin_fd is not None
            self._read_socket(False)
            self.loop.add_writer(self.stdin_fd, self._on_readable)
            self.stdin_stalled = True
            self._arm_watchdog()  # meanwhile a hang-up goes unseen: poll for it now and then
        return False

    def _socket_empty(self) -> bool:
        """Nothing to read: from now on wait for the socket (the pipe has room)."""
        self._unstall_stdin()
        return False

    def _unstall_stdin(self) -> None:
        if self.stdin_stalled:
            self.stdin_stalled = False
            if self.stdin_fd is not None:
                self.loop.remove_writer(self.stdin_fd)
            self._read_socket(not self.closed)

    def _arm_watchdog(self) -> None:
        """While the socket is not read a hang-up goes unseen; poll for it now and then."""
        if self.watchdog is None:
            self.watchdog = self.loop.call_later(0.5, self._check_hangup)

    def _check_hangup(self) -> None:
        self.watchdog = None
        if self.reading or self.closed:
            return
        poller = select.poll()
        poller.register(self.fd, select.POLLRDHUP)
        gone = select.POLLHUP | select.POLLRDHUP | select.POLLERR
        if any(ev & gone for _, ev in poller.poll(0)):
            self._client_gone()
        else:
            self._arm_watchdog()

    def _close_stdin(self) -> None:
        if self.stdin_fd is not None:
            self.loop.remove_writer(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None
            self.stdin_stalled = False
            self._read_socket(not self.closed)
