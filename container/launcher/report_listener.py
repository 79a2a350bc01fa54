"""What the main node's listener (node_fault.py listen) needs beyond the lines themselves: connections read
side by side, and, on Batch, which address may speak for which node.

Connections: each accepted connection gets CONNECTION_SECONDS to send its one line and close; they are read
side by side, so a client that connects and says nothing holds no one else up. With `reply`, the answer it
gives a completed line (the straggler watch's order, node_fault.py) is written back before the connection
closes; a client that does not read it loses nothing else.

Senders (on Batch, where the node watch runs): node_watch.py writes each child's address from DescribeJobs to
CHILDREN/node-<n>.address (`container.networkInterfaces[].privateIpv4Address`; Batch API reference,
NetworkInterface: "the elastic network interface for a multi-node parallel job node"). A line about node n is
taken only from that address: the side port is open to the fleet's security group, which every job's nodes
share, and the job id, which ListJobs shows, must not be enough to end a job. A line from another address is
dropped, and the listener's log says so once per address, naming both. A line about a node whose address is
not known yet waits for it (the node watch asks every NODE_WATCH_SECONDS, every second once the trainer
failed): a node that Batch never shows running sends nothing that counts. Only when the watch says it cannot
ask Batch (CHILDREN/addresses.unknown: no batch:DescribeJobs) are lines taken unverified, said once. That a
child's connection comes from its task ENI's privateIpv4Address is inferred (in awsvpc mode the task's one
interface carries its traffic), not stated by AWS: a mismatch is said loudly.
Stdlib only, Python 3.10.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CONNECTION_SECONDS = 2.0
ADDRESS_UNKNOWN = "addresses.unknown"
# Lines kept while their nodes' addresses are unknown: a keepalive every 5 s from each child, for a few polls.
WAITING_LINES = 4096
LINE_BYTES = 4096  # node_fault.REPORT_BYTES


def address_file(children: Path, node: int) -> Path:
    return children / f"node-{node}.address"


@dataclass(frozen=True)
class Line:
    text: str
    peer: str
    at: float  # when it arrived, epoch seconds


def speaker(text: str, job: str) -> int | None:
    """The node a line of job `job` speaks for ("alive <job> <n>", "end <job> {"node": n, ...}", "hang <job>
    {"node": n, ...}"); None for another job's line or one that names no node."""
    _, _, rest = text.partition(" ")
    reported_job, _, payload = rest.partition(" ")
    if reported_job != job:
        return None
    if payload.isdigit() and len(payload) <= 6:
        return int(payload)
    try:
        node = json.loads(payload).get("node")
    except (ValueError, AttributeError, RecursionError):  # a line nested past the parser's depth: no node
        return None
    return node if isinstance(node, int) and not isinstance(node, bool) and 0 <= node < 1 << 20 else None


def of_job(text: str, job: str) -> bool:
    return text.partition(" ")[2].partition(" ")[0] == job


def say(text: str) -> None:
    print(f"node_fault.py: {text}", file=sys.stderr, flush=True)


@dataclass
class Senders:
    """Which address may speak for which node (see the module's docstring)."""

    children: Path
    job: str
    said: set[tuple[int, str]] = field(default_factory=set)
    unverified: bool = False

    def judge(self, line: Line) -> str:
        """ "take", "wait" (the node's address is not known yet) or "drop"."""
        node = speaker(line.text, self.job)
        if node is None:
            # Another job's line (node_fault.take ignores it), or one of this job that names no node as an
            # int: never taken unchecked, or a "1" or a 1.0 would speak for node 1 from any address.
            return "drop" if of_job(line.text, self.job) else "take"
        try:
            known = address_file(self.children, node).read_text().strip()
        except OSError:
            known = ""
        if not known:
            if not (self.children / ADDRESS_UNKNOWN).exists():
                return "wait"
            if not self.unverified:
                self.unverified = True
                say(f"no address from Batch for node {node}: taking the children's lines without checking the sender")
            return "take"
        if known == line.peer:
            return "take"
        if (node, line.peer) not in self.said:
            self.said.add((node, line.peer))
            say(f"a line for node {node} came from {line.peer}, but Batch gives node {node} {known}: ignored")
        return "drop"


@dataclass
class Client:
    peer: str
    deadline: float
    data: bytes = b""


class Connections:
    """The listening socket and the connections it accepted, read side by side."""

    def __init__(
        self, server: socket.socket, seconds: float = CONNECTION_SECONDS, reply: Callable[[str], bytes] | None = None
    ) -> None:
        server.setblocking(False)
        self.server, self.seconds, self.reply = server, seconds, reply
        self.clients: dict[socket.socket, Client] = {}

    def sockets(self) -> list[socket.socket]:
        return [self.server, *self.clients]

    def read(self, ready: list[socket.socket], now: float) -> list[Line]:
        """The lines completed by what `ready` holds; connections past their time are closed unheard."""
        lines = []
        for sock in ready:
            if sock is self.server:
                try:
                    connection, address = self.server.accept()
                except OSError:  # gone before it was accepted
                    continue
                connection.setblocking(False)
                self.clients[connection] = Client(str(address[0]), now + self.seconds)
                continue
            client = self.clients[sock]
            try:
                data = sock.recv(LINE_BYTES)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            client.data += data
            if data and b"\n" not in client.data and len(client.data) < LINE_BYTES:
                continue
            text = client.data.decode(errors="replace").split("\n", 1)[0].strip()
            answer = b""
            if self.reply is not None and text:
                try:
                    answer = self.reply(text)
                except Exception as error:
                    say(f"no answer to a line from {client.peer}: {error.__class__.__name__}")
            if answer:
                with contextlib.suppress(OSError):  # a few hundred bytes fit a fresh socket's buffer
                    sock.send(answer)
            self._close(sock)
            if text:
                lines.append(Line(text, client.peer, time.time()))
        for sock, client in list(self.clients.items()):
            if now >= client.deadline:
                self._close(sock)
        return lines

    def _close(self, sock: socket.socket) -> None:
        self.clients.pop(sock, None)
        sock.close()

    def close(self) -> None:
        for sock in list(self.clients):
            self._close(sock)
