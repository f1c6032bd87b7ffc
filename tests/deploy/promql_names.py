"""Metric names in PromQL expressions, and the metric names a live straitd serves.

Shared by check_prometheus.py (alert rules) and check_grafana.py (dashboard): both hold what
operators query to what straitd really exports, so renaming a metric in
lib/gateway/gateway_metrics.cc breaks them.

- metric_names(expr): the metric names an expression selects. A small PromQL lexer, not a
  parser: strings, label matchers {...}, ranges/subqueries [...], numbers and durations,
  Grafana variables ($var, ${var}, [[var]]) are skipped; the label lists after by, without, on,
  ignoring, group_left and group_right are skipped; an identifier followed by '(', by or
  without is a function or an aggregation; keywords (and, or, unless, bool, offset, ...) are
  skipped. Every other identifier is a metric name. {__name__="x"} selectors count too.
- exported_names(straitd): starts straitd (plain TCP on loopback, a Unix socket in a temporary
  directory, [metrics] on a free loopback port), GETs /metrics once and returns every sample
  name its `# TYPE` lines declare (a histogram's _bucket, _sum and _count).
"""
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan", "atan2", "start", "end"}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# Series Prometheus makes itself for every scrape target (not straitd's to export).
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                        "scrape_samples_post_metric_relabeling", "scrape_series_added"}

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[^\]]*\]\])
  | (?P<number>(?:0x[0-9a-fA-F]+|[0-9][0-9.]*(?:[eE][+-]?[0-9]+)?)(?:[a-zA-Z]+[0-9]*)*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<open>[({\[])
  | (?P<close>[)}\]])
  | (?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=,@:])
""", re.VERBOSE)


def tokens(expr):
    pos = 0
    out = []
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot lex PromQL at {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group()))
    return out


def _skip_group(toks, i):
    """toks[i] is an opening bracket; returns the index after its matching close."""
    depth = 0
    while i < len(toks):
        kind, text = toks[i]
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets")


def metric_names(expr):
    toks = tokens(expr)
    names = set()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else (None, None)
        if kind == "open" and text == "{":
            # A matcher block: only __name__ names a metric.
            end = _skip_group(toks, i)
            inner = toks[i + 1:end - 1]
            for j in range(len(inner) - 2):
                if inner[j] == ("ident", "__name__") and inner[j + 1] == ("op", "=") and \
                        inner[j + 2][0] == "string":
                    names.add(inner[j + 2][1][1:-1])
            i = end
        elif kind == "open" and text == "[":
            i = _skip_group(toks, i)
        elif kind == "ident" and text in LABEL_LIST_KEYWORDS:
            i += 1
            if i < len(toks) and toks[i] == ("open", "("):
                i = _skip_group(toks, i)
        elif kind == "ident" and text.lower() in KEYWORDS:
            i += 1
        elif kind == "ident" and (nxt == ("open", "(") or
                                  (nxt[0] == "ident" and nxt[1] in ("by", "without"))):
            i += 1  # a function, or an aggregation (`sum by (l) (...)` too)
        elif kind == "ident":
            names.add(text)
            i += 1
        else:
            i += 1
    return names


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exported_names(straitd, timeout=20):
    """Sample names straitd's /metrics declares (starts and stops one straitd)."""
    with tempfile.TemporaryDirectory(prefix="strait-metrics-names-") as d:
        sock = os.path.join(d, "gw.sock")
        mport = _free_port()
        config = os.path.join(d, "straitd.toml")
        with open(config, "w") as f:
            f.write(f'''region = "us"
shard_index = 0
[local]
socket = "{sock}"
allowed_uids = [{os.getuid()}]
[wan]
listen = "127.0.0.1:{_free_port()}"
transport = "plain"
[peers.eu]
shard_0 = "127.0.0.1:{_free_port()}"
[metrics]
listen = "127.0.0.1:{mport}"
[allreduce]
shutdown_grace = "1s"
''')
        proc = subprocess.Popen([straitd, "--config", config], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                                timeout=2) as r:
                        text = r.read().decode()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("straitd did not serve /metrics: " +
                                           (proc.communicate(timeout=5)[0] if proc.poll()
                                            is not None else "timeout"))
                    time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count"}
            elif kind == "summary":
                names |= {name, name + "_sum", name + "_count"}
            else:
                names.add(name)
    if not names:
        raise RuntimeError("straitd's /metrics declared no metric family:\n" + text)
    return names
