"""What the services a test starts listen on: every one binds the loopback only (issue 59 point 12: the harness's
Airflow API server listened on 0.0.0.0, Airflow's default, reachable from the network while a test ran).
:func:`beyond_loopback` lists the TCP sockets a process tree listens on at any other address; the harnesses that start
services (tests/dags/airflow_services.py, tests/test_stack_services.py) fail a test that leaves one."""

from __future__ import annotations

import ipaddress


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1 and IPv4-mapped 127.x (::ffff:127.0.0.1); not 0.0.0.0 or :: (every interface)."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def listening(pids) -> list[tuple[int, str, str, int]]:
    """(pid, process name, ip, port) of every TCP socket in LISTEN state of the processes ``pids`` and all their
    descendants (their forked workers and helper processes included)."""
    import psutil

    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            for q in (p, *p.children(recursive=True)):
                procs[q.pid] = q
        except psutil.NoSuchProcess:
            continue
    out = []
    for q in procs.values():
        try:
            conns, name = q.net_connections(kind="tcp"), q.name()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        out += [(q.pid, name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return sorted(out)


def _wide(sockets) -> list[str]:
    """``"<name> (pid N) listens on IP:PORT"`` for each socket of ``sockets`` (:func:`listening`'s tuples) that is not
    on the loopback."""
    return [f"{name} (pid {pid}) listens on {ip}:{port}" for pid, name, ip, port in sockets if not is_loopback(ip)]


def beyond_loopback(pids) -> list[str]:
    """:func:`_wide` of every listening socket of :func:`listening`; [] when every one is on the loopback."""
    return _wide(listening(pids))


def require_loopback_only(pids, what: str) -> list[tuple[int, str, str, int]]:
    """AssertionError naming each socket of ``what`` (the services started) that listens beyond the loopback; else
    the sockets seen (:func:`listening`), for a caller that checks more of them."""
    sockets = listening(pids)
    wide = _wide(sockets)
    assert not wide, f"{what}: a test-started service listens beyond 127.0.0.1: {'; '.join(wide)}"
    return sockets
