#!/usr/bin/env python3
"""straitd's systemd readiness protocol (Type=notify in deploy/systemd/straitd.service).

Usage: check_sd_notify.py STRAITD

Starts straitd (plain TCP on 127.0.0.1, a Unix socket in a temporary directory) twice, with
NOTIFY_SOCKET naming a datagram socket this script listens on: once a filesystem path, once an
abstract name ("@..."). Each time straitd must send READY=1 (with a STATUS=) only after its local
socket exists, then STOPPING=1 on SIGTERM, and exit 0. Without NOTIFY_SOCKET it must start and
stop the same way (nothing to notify). Exits 1 with a message on any failure.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(d):
    sock = os.path.join(d, "gw.sock")
    path = os.path.join(d, "straitd.toml")
    with open(path, "w") as f:
        f.write(f'''region = "us"
shard_index = 0
[local]
socket = "{sock}"
allowed_uids = [{os.getuid()}]
[wan]
listen = "127.0.0.1:{free_port()}"
transport = "plain"
[peers.eu]
shard_0 = "127.0.0.1:{free_port()}"
[allreduce]
shutdown_grace = "2s"
''')
    return path, sock


def fail(msg, proc=None):
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    print(f"check_sd_notify: FAIL: {msg}")
    sys.exit(1)


def run_once(straitd, d, notify_addr, bind_addr):
    config, sock = write_config(d)
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    listener = None
    if notify_addr is not None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listener.bind(bind_addr)
        listener.settimeout(20)
        env["NOTIFY_SOCKET"] = notify_addr
    proc = subprocess.Popen([straitd, "--config", config], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    what = f"NOTIFY_SOCKET={notify_addr}"
    if listener is not None:
        try:
            ready = listener.recv(4096).decode()
        except socket.timeout:
            fail(f"{what}: no datagram from straitd within 20 s", proc)
        lines = ready.split("\n")
        if "READY=1" not in lines or not any(l.startswith("STATUS=") for l in lines):
            fail(f"{what}: first datagram is {ready!r}; expected READY=1 and STATUS=", proc)
        if not os.path.exists(sock):
            fail(f"{what}: READY=1 came before the local socket {sock} existed", proc)
    else:
        deadline = time.monotonic() + 20
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"without NOTIFY_SOCKET straitd did not come up: {proc.stdout.read()}", proc)
            time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    if listener is not None:
        try:
            stopping = listener.recv(4096).decode()
        except socket.timeout:
            fail(f"{what}: no STOPPING=1 after SIGTERM", proc)
        if stopping.split("\n") != ["STOPPING=1"]:
            fail(f"{what}: after SIGTERM got {stopping!r}; expected STOPPING=1", proc)
        listener.close()
    try:
        rc = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        fail(f"{what}: straitd did not exit within 20 s of SIGTERM", proc)
    out = proc.stdout.read()
    if rc != 0:
        fail(f"{what}: straitd exited {rc}: {out}")
    if "cannot notify systemd" in out or "is not a Unix socket" in out:
        fail(f"{what}: straitd logged a notify failure: {out}")


def main():
    straitd = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="strait-notify-") as d:
        path = os.path.join(d, "notify")
        run_once(straitd, d, path, path)
        name = f"strait-notify-test-{os.getpid()}"
        run_once(straitd, d, "@" + name, "\0" + name)
        run_once(straitd, d, None, None)
    print("check_sd_notify: READY=1 and STOPPING=1 over path and abstract sockets; "
          "plain start without NOTIFY_SOCKET: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
