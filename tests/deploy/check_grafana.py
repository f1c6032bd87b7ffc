#!/usr/bin/env python3
"""deploy/grafana/strait.json: a Grafana dashboard whose every query names metrics straitd exports.

Usage: check_grafana.py STRAITD DEPLOY_DIR

- the file is JSON with a uid, a title, panels with unique ids, and a `datasource` variable of
  type prometheus that every panel and query uses (so it imports into any Grafana);
- every PromQL expression (panel targets and the `label_values(...)` of template variables)
  names only series a live straitd's /metrics declares, or `up` (made by Prometheus per
  target), so renaming a metric in lib/gateway/gateway_metrics.cc breaks this test;
- with Grafana's variables replaced by values, every expression parses: they are handed to
  `promtool check rules` as recording rules (skipped with a note where promtool is missing);
- the check is real: a copy of the dashboard with one metric renamed fails it.
Families straitd exports that no panel shows are listed (not a failure). Exits 1 on a failed
check.
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

import promql_names

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def expressions(dash):
    """(where, PromQL) for every query of the dashboard."""
    out = []
    for p in walk_panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t.get("expr", "")))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        # label_values(expr, label) / query_result(expr): the expression inside.
        m = re.fullmatch(r"\s*(?:label_values|query_result)\((.*?)(?:,\s*\w+)?\)\s*", q)
        out.append((f"variable {v.get('name')}", m.group(1) if m else q))
    return out


def unknown_names(dash, exported):
    bad = []
    for where, expr in expressions(dash):
        try:
            names = promql_names.metric_names(expr)
        except ValueError as e:
            bad.append((where, f"<unparsable: {e}>"))
            continue
        if not names:
            bad.append((where, "<no metric>"))
        bad += [(where, n) for n in sorted(names - exported)]
    return bad


def concrete(expr):
    """The expression with Grafana's variables replaced, as Prometheus would get it."""
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5m", expr)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def main():
    straitd, deploy = sys.argv[1], sys.argv[2]
    path = os.path.join(deploy, "grafana", "strait.json")
    with open(path) as f:
        try:
            dash = json.load(f)
        except json.JSONDecodeError as e:
            print(f"FAIL: {path} is not JSON: {e}")
            return 1
    check(dash.get("uid") and dash.get("title"), "dashboard has no uid or title")
    panels = list(walk_panels(dash.get("panels", [])))
    check(len([p for p in panels if p.get("type") != "row"]) >= 10,
          "dashboard has fewer than 10 panels")
    ids = [p.get("id") for p in panels]
    check(len(ids) == len(set(ids)) and None not in ids, f"panel ids missing or repeated: {ids}")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
          "no `datasource` variable of type datasource/prometheus")
    for p in panels:
        if p.get("type") == "row":
            continue
        check(p.get("datasource", {}).get("uid") == "${datasource}",
              f"panel {p.get('title')!r} does not use ${{datasource}}")
        check(p.get("targets"), f"panel {p.get('title')!r} has no query")
        for t in p.get("targets", []):
            check(t.get("datasource", {}).get("uid") == "${datasource}",
                  f"panel {p.get('title')!r} target {t.get('refId')} does not use ${{datasource}}")
            for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", t.get("expr", "")):
                check(var.startswith("__") or var in variables,
                      f"panel {p.get('title')!r} uses undefined variable ${var}")

    exported = promql_names.exported_names(straitd) | promql_names.PROMETHEUS_SYNTHETIC
    exprs = expressions(dash)
    print(f"{len(exprs)} expressions; straitd exports "
          f"{len(exported) - len(promql_names.PROMETHEUS_SYNTHETIC)} series names")
    for where, name in unknown_names(dash, exported):
        check(False, f"strait.json {where} names {name}, which straitd does not export")
    used = set()
    for _, expr in exprs:
        used |= promql_names.metric_names(expr)
    unshown = sorted(n for n in exported - promql_names.PROMETHEUS_SYNTHETIC
                     if n not in used and not n.endswith(("_sum", "_count")))
    if unshown:
        print("note: no panel shows " + ", ".join(unshown))

    if shutil.which("promtool") is None:
        print("note: promtool not found; PromQL syntax not checked")
    else:
        rules = {"groups": [{"name": "grafana", "rules": [
            {"record": f"strait_grafana:expr_{i}", "expr": concrete(e)}
            for i, (_, e) in enumerate(exprs)]}]}
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            yaml.safe_dump(rules, f)
            f.flush()
            p = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True,
                               text=True)
            check(p.returncode == 0, "a dashboard expression does not parse (promtool check "
                  f"rules on them, variables replaced):\n{p.stdout}{p.stderr}")

    # Self-test: a renamed metric must be caught.
    renamed = copy.deepcopy(dash)
    target = next(t for p in walk_panels(renamed["panels"]) for t in p.get("targets", [])
                  if "strait_peer_goodput_bytes_per_second" in t.get("expr", ""))
    target["expr"] = target["expr"].replace("strait_peer_goodput_bytes_per_second",
                                            "strait_peer_goodput_bytes")
    check(any(n == "strait_peer_goodput_bytes" for _, n in unknown_names(renamed, exported)),
          "self-test: a dashboard with a renamed metric passes the name check")

    for f in failures:
        print("FAIL:", f)
    print(f"check_grafana: {'%d failed' % len(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
