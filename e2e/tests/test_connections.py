"""Connection limits of ``iris serve`` (docs/configuration.md, "Connections"):
a flood of connections that send half a request head and stall neither
blocks ``/health`` nor outlives ``--header-read-timeout-secs``; past
``--max-connections`` new connections are refused at once while open ones
are served; a body slower than ``--body-read-timeout-secs`` gets 408; idle
kept-alive connections close after ``--keep-alive-timeout-secs``; and
``--metrics-port`` moves ``/metrics`` off the API port.
"""

import json
import resource
import socket
import time

import httpx

from conftest import aggregated, free_port, metric, wait_until

PARTIAL_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
STALLED = 3000
# Long enough that every stalled head is still open once the last one is
# (opening 3,000 took over 5 s on a loaded CI machine), short enough to
# wait for.
HEADER_TIMEOUT_S = 20


def raise_own_fd_limit(needed: int):
    """This test process holds ``needed`` sockets at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed + 256 and (hard == resource.RLIM_INFINITY or hard > soft):
        target = needed + 256 if hard == resource.RLIM_INFINITY else min(hard, needed + 256)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def stall(port: int, count: int) -> list:
    """``count`` connections that each sent part of a request head."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(PARTIAL_HEAD)
        socks.append(sock)
    return socks


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the gateway closes ``sock`` (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def http_exchange(sock: socket.socket, path: str = "/health") -> bytes:
    """One keep-alive GET on ``sock``; the raw response (head and body)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_health_answers_during_a_partial_header_flood_and_stalled_heads_time_out(
        processes, model_dir):
    raise_own_fd_limit(STALLED)
    dep = aggregated(processes, model_dir,
                     gateway_args=("--header-read-timeout-secs", str(HEADER_TIMEOUT_S)))
    gw = dep.gateway
    before = rss_mb(gw.process.popen.pid)
    opened = time.monotonic()
    socks = stall(gw.port, STALLED)
    last_opened = time.monotonic()
    assert last_opened - opened < HEADER_TIMEOUT_S / 2, \
        f"opening {STALLED} connections took {last_opened - opened:.1f} s"
    try:
        # A fresh connection is answered at once, the flood notwithstanding.
        started = time.monotonic()
        response = httpx.get(f"{gw.base_url}/health", timeout=5)
        health_s = time.monotonic() - started
        assert response.status_code == 200 and response.json() == {"status": "ok"}
        assert health_s < 2.0, f"/health took {health_s:.2f} s with {STALLED} stalled heads"
        open_now = metric(gw.metrics(), "iris_http_connections_open", listener="api")
        assert open_now is not None and open_now >= STALLED, open_now
        print(f"\n{STALLED} stalled heads: /health in {health_s * 1000:.1f} ms, "
              f"gateway RSS {before:.0f} -> {rss_mb(gw.process.popen.pid):.0f} MB")
        # Not closed early (the last head opened is watched until half the
        # timeout has passed for it), then closed once the timeout is over.
        last = socks[-1]
        early = HEADER_TIMEOUT_S / 2 - (time.monotonic() - last_opened)
        assert early > 1, f"/health and /metrics took {HEADER_TIMEOUT_S / 2 - early:.1f} s"
        assert not closed_by_peer(last, early), \
            "a stalled head was closed before --header-read-timeout-secs"
        assert closed_by_peer(last, HEADER_TIMEOUT_S), \
            "a stalled head outlived --header-read-timeout-secs"
        assert closed_by_peer(socks[0], 1), "the first stalled head outlived the timeout"
        assert all(closed_by_peer(s, 10) for s in socks[-50:])
        wait_until(lambda: (metric(gw.metrics(), "iris_http_header_timeouts_total", listener="api")
                            or 0) >= STALLED, 20, "every stalled head to be counted")
        # The gateway still serves chats.
        chat = gw.client().chat.completions.create(
            model=gw.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.choices[0].message.content is not None
    finally:
        for sock in socks:
            sock.close()


def test_past_the_cap_new_connections_are_refused_fast_and_open_ones_served(
        processes, model_dir):
    cap = 20
    metrics_port = free_port()
    dep = aggregated(processes, model_dir, gateway_args=(
        "--max-connections", str(cap), "--metrics-port", str(metrics_port)))
    gw = dep.gateway
    metrics_url = f"http://127.0.0.1:{metrics_port}"
    kept = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    idle = []
    try:
        assert b" 200 " in http_exchange(kept).split(b"\r\n")[0]
        # Fill the cap with idle connections (the readiness poller's is
        # closed: wait until only ours are open).
        wait_until(lambda: metric(httpx.get(f"{metrics_url}/metrics").text,
                                  "iris_http_connections_open", listener="api") == 1,
                   10, "the fixture's connections to close")
        idle = [socket.create_connection(("127.0.0.1", gw.port), timeout=10)
                for _ in range(cap - 1)]
        wait_until(lambda: metric(httpx.get(f"{metrics_url}/metrics").text,
                                  "iris_http_connections_open", listener="api") == cap,
                   10, "the cap to be reached")
        # A new connection is refused at once: a 503 in the OpenAI error
        # shape, or (if the refusal beat the request) a closed socket.
        for _ in range(3):
            started = time.monotonic()
            try:
                response = httpx.get(f"{gw.base_url}/health", timeout=5)
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "too_many_connections"
            except httpx.TransportError:
                pass
            assert time.monotonic() - started < 2.0, "refusal was not quick"
        # The open keep-alive connection is still served.
        assert b" 200 " in http_exchange(kept).split(b"\r\n")[0]
        # Probes and scrapes on the metrics port are outside the cap.
        assert httpx.get(f"{metrics_url}/health", timeout=5).status_code == 200
        text = httpx.get(f"{metrics_url}/metrics", timeout=5).text
        assert (metric(text, "iris_http_connections_refused_total", listener="api") or 0) >= 3
        # /metrics is not on the API port any more.
        assert b" 404 " in http_exchange(kept, "/metrics").split(b"\r\n")[0]
        # Below the cap again, new connections are served.
        for sock in idle:
            sock.close()
        wait_until(lambda: httpx.get(f"{gw.base_url}/health", timeout=5).status_code == 200,
                   10, "a new connection to be served below the cap")
    finally:
        kept.close()
        for sock in idle:
            sock.close()


def test_slow_bodies_get_408_and_idle_connections_close(processes, model_dir):
    dep = aggregated(processes, model_dir, gateway_args=(
        "--header-read-timeout-secs", "20", "--body-read-timeout-secs", "1",
        "--keep-alive-timeout-secs", "1", "--max-requests-per-connection", "2"))
    gw = dep.gateway
    # A body that trickles: 10 of 1000 declared bytes, then nothing.
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    try:
        sock.sendall(PARTIAL_HEAD + b"Content-Length: 1000\r\n\r\n" + b'{"model": "')
        started = time.monotonic()
        sock.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        elapsed = time.monotonic() - started
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), data
        assert b"connection: close" in head.lower(), head
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout" and "body" in error["message"], error
        assert 0.8 <= elapsed < 5, f"408 after {elapsed:.2f} s"
        assert closed_by_peer(sock, 5)
    finally:
        sock.close()

    # Keep-alive: the connection stays for the next request, and is closed
    # once idle past --keep-alive-timeout-secs (well before the header
    # timeout of 20 s).
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    try:
        first = http_exchange(sock)
        assert b"connection: close" not in first.lower()
        started = time.monotonic()
        assert closed_by_peer(sock, 10), "an idle connection outlived --keep-alive-timeout-secs"
        idle = time.monotonic() - started
        assert 0.8 <= idle < 8, f"idle connection closed after {idle:.2f} s"
    finally:
        sock.close()

    # --max-requests-per-connection 2: the second answer closes.
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    try:
        assert b"connection: close" not in http_exchange(sock).lower()
        assert b"connection: close" in http_exchange(sock).lower()
        assert closed_by_peer(sock, 5)
    finally:
        sock.close()
