"""A single-threaded epoll HTTP server: the workload of the network flood tests.

Runs inside a runsc sandbox. One `selectors.EpollSelector`, created at start
and therefore saved in every checkpoint, watches a non-blocking TCP listener,
every client connection, and a UDP socket on the same port number: the shape
of google/gvisor#13920 (an epoll instance from before the checkpoint that must
report the restored listener). Standard library only, so it starts in well
under a second.

  GET /health -> 200 {"ok": true}
  GET /state  -> 200 {"boot_id", "served", "accepted", "open", "udp_datagrams", "bad_requests"}
  other paths -> 404; a malformed request -> 400 and the connection closes

HTTP/1.1 keep-alive: a client may send many requests on one connection, which
is how the tests hold connections open across a checkpoint.
"""
import json
import os
import selectors
import socket
import sys
import time

MAX_REQUEST = 8192
IDLE_S = 60.0          # connections idle this long are closed
BOOT_ID = os.urandom(8).hex()
STATS = {"served": 0, "accepted": 0, "udp_datagrams": 0, "bad_requests": 0}


class Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "last", "closing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = b""
        self.outbuf = b""
        self.last = time.monotonic()
        self.closing = False


def response(status: int, body: dict, keep_alive: bool) -> bytes:
    data = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode() + data


def handle_requests(c: Conn, conns: dict) -> None:
    while b"\r\n\r\n" in c.inbuf and not c.closing:
        head, _, c.inbuf = c.inbuf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or parts[0] != b"GET" or not parts[2].startswith(b"HTTP/1."):
            STATS["bad_requests"] += 1
            c.outbuf += response(400, {"error": "bad request"}, False)
            c.closing = True
            return
        keep = not any(ln.lower().replace(b" ", b"") == b"connection:close" for ln in lines[1:])
        path = parts[1].decode(errors="replace")
        if path == "/health":
            out = response(200, {"ok": True}, keep)
        elif path == "/state":
            out = response(200, {"boot_id": BOOT_ID, "open": len(conns), **STATS}, keep)
        else:
            out = response(404, {"error": "not found"}, keep)
        STATS["served"] += 1
        c.outbuf += out
        if not keep:
            c.closing = True
    if len(c.inbuf) > MAX_REQUEST:
        STATS["bad_requests"] += 1
        c.outbuf += response(400, {"error": "request too large"}, False)
        c.closing = True


def main(port: int) -> None:
    sel = selectors.EpollSelector()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("0.0.0.0", port))
    lsock.listen(1024)
    lsock.setblocking(False)
    usock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    usock.bind(("0.0.0.0", port))
    usock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ, "listen")
    sel.register(usock, selectors.EVENT_READ, "udp")
    conns: dict[int, Conn] = {}

    def close(c: Conn) -> None:
        conns.pop(c.sock.fileno(), None)
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def want(c: Conn) -> None:
        sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.outbuf else 0), c)

    last_sweep = time.monotonic()
    while True:
        for key, mask in sel.select(timeout=1.0):
            if key.data == "listen":
                for _ in range(64):  # drain the accept queue, boundedly
                    try:
                        s, _ = lsock.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        break
                    s.setblocking(False)
                    c = Conn(s)
                    conns[s.fileno()] = c
                    STATS["accepted"] += 1
                    sel.register(s, selectors.EVENT_READ, c)
            elif key.data == "udp":
                for _ in range(256):
                    try:
                        usock.recvfrom(2048)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        break
                    STATS["udp_datagrams"] += 1
            else:
                c = key.data
                c.last = time.monotonic()
                if mask & selectors.EVENT_READ:
                    try:
                        data = c.sock.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except OSError:
                        close(c)
                        continue
                    if data == b"":
                        close(c)
                        continue
                    if data:
                        c.inbuf += data
                        handle_requests(c, conns)
                if c.outbuf:
                    try:
                        n = c.sock.send(c.outbuf)
                        c.outbuf = c.outbuf[n:]
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        close(c)
                        continue
                if c.closing and not c.outbuf:
                    close(c)
                    continue
                want(c)
        now = time.monotonic()
        if now - last_sweep > 1.0:
            last_sweep = now
            for c in [c for c in conns.values() if now - c.last > IDLE_S]:
                close(c)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8080)
