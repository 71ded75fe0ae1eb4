"""tests/listeners.py, the check every harness that starts services runs (issue 59 point 12): it sees a real socket
bound to every interface, and passes one bound to 127.0.0.1 (real processes, real sockets)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.listeners import beyond_loopback, is_loopback, listening, require_loopback_only

SERVE = """
import socket, sys, time
s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("host, wide", [("0.0.0.0", True), ("127.0.0.1", False), ("::", True), ("::1", False)])
def test_a_process_listening_beyond_the_loopback_is_named(host, wide):
    import socket

    if ":" in host and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    # the listener is a grandchild (as Airflow's forked workers are): the check walks the tree
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {SERVE!r}, {host!r}])"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())
        assert [(ip, p) for _, _, ip, p in listening([proc.pid])] == [(host, port)]
        if wide:
            assert beyond_loopback([proc.pid]) and f"listens on {host}:{port}" in beyond_loopback([proc.pid])[0]
            with pytest.raises(
                AssertionError, match=rf"svc: a test-started service listens beyond 127\.0\.0\.1: .*{port}"
            ):
                require_loopback_only([proc.pid], "svc")
        else:
            assert beyond_loopback([proc.pid]) == []
            require_loopback_only([proc.pid], "svc")
    finally:
        import psutil

        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()


def test_loopback_addresses():
    assert all(is_loopback(ip) for ip in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"))
    assert not any(is_loopback(ip) for ip in ("0.0.0.0", "::", "10.0.0.2", "::ffff:10.0.0.2", "fe80::1%eth0"))
