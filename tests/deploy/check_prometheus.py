#!/usr/bin/env python3
"""deploy/prometheus/strait-rules.yml: valid, unit-tested, and about metrics straitd exports.

Usage: check_prometheus.py STRAITD DEPLOY_DIR

- `promtool check rules` accepts the rules file and `promtool test rules` passes its unit tests
  (strait-rules.test.yml: each alert fires on its series and stays quiet beside them);
- the rules hold the alerts the operators asked for (gateway down, not ready, all-reduce
  failures, refused TLS peers, link reconnect storm, slow all-reduce p99);
- every metric an expression selects, every strait_* name an annotation mentions and every
  series the unit tests feed in is one a live straitd's /metrics declares (or `up`, which
  Prometheus makes per target), so renaming a metric in straitd breaks this test;
- the checks are real: a rule naming a metric straitd lacks is caught, and a rule with a changed
  threshold fails the unit tests.
Exits 77 (skipped) when promtool is missing (Debian's prometheus package ships it), 1 on a
failed check.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

import promql_names

ALERTS = ["StraitGatewayDown", "StraitGatewayNotReady", "StraitAllReduceFailures",
          "StraitRefusedPeers", "StraitLinkReconnectStorm", "StraitAllReduceSlow"]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def promtool(*args, cwd=None):
    p = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def unknown_names(rules, exported):
    """(where, name) for every metric name the rules use that straitd does not export."""
    bad = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            what = rule.get("alert") or rule.get("record")
            for name in sorted(promql_names.metric_names(rule["expr"])):
                if name not in exported:
                    bad.append((f"{what}: expr", name))
            for key, text in rule.get("annotations", {}).items():
                # Metric names in the prose, not label references inside {{ ... }}.
                prose = re.sub(r"\{\{.*?\}\}", " ", text)
                for name in re.findall(r"\bstrait_[a-z0-9_]+", prose):
                    if name not in exported:
                        bad.append((f"{what}: annotation {key}", name))
    return bad


def main():
    straitd, deploy = sys.argv[1], sys.argv[2]
    if shutil.which("promtool") is None:
        print("SKIP: promtool not found (Debian's prometheus package; scripts/setup.sh "
              "installs it)")
        return 77
    pdir = os.path.join(deploy, "prometheus")
    rules_path = os.path.join(pdir, "strait-rules.yml")
    tests_path = os.path.join(pdir, "strait-rules.test.yml")

    rc, out = promtool("check", "rules", rules_path)
    check(rc == 0, f"promtool check rules {rules_path} failed:\n{out}")
    rc, out = promtool("test", "rules", os.path.basename(tests_path), cwd=pdir)
    check(rc == 0, f"promtool test rules {tests_path} failed:\n{out}")

    with open(rules_path) as f:
        rules = yaml.safe_load(f)
    alerts = [r.get("alert") for g in rules["groups"] for r in g["rules"]]
    for a in ALERTS:
        check(a in alerts, f"strait-rules.yml has no alert {a}")
    with open(tests_path) as f:
        tests = yaml.safe_load(f)
    tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
    for a in alerts:
        check(a in tested, f"strait-rules.test.yml never tests alert {a}")

    exported = promql_names.exported_names(straitd) | promql_names.PROMETHEUS_SYNTHETIC
    print(f"straitd exports {len(exported) - len(promql_names.PROMETHEUS_SYNTHETIC)} series "
          "names")
    for where, name in unknown_names(rules, exported):
        check(False, f"strait-rules.yml {where} names {name}, which straitd does not export")
    for case in tests["tests"]:
        for s in case.get("input_series", []):
            name = re.match(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)", s["series"]).group(1)
            check(name in exported, f"strait-rules.test.yml feeds series {name}, which straitd "
                  "does not export")

    # Self-tests: the checks above must be able to fail.
    renamed = yaml.safe_load(yaml.safe_dump(rules))
    renamed["groups"][0]["rules"][1]["expr"] = "strait_peer_link_up == 0"
    check(("StraitGatewayNotReady: expr", "strait_peer_link_up") in
          unknown_names(renamed, exported),
          "self-test: a rule on a metric straitd does not export passes the name check")
    with tempfile.TemporaryDirectory(prefix="strait-rules-") as d:
        with open(rules_path) as f:
            text = f.read()
        broken = text.replace("> 0.05", "> 0.5", 1)
        check(broken != text, "self-test: no '> 0.05' threshold in strait-rules.yml to change")
        with open(os.path.join(d, "strait-rules.yml"), "w") as f:
            f.write(broken)
        shutil.copy(tests_path, d)
        rc, out = promtool("test", "rules", os.path.basename(tests_path), cwd=d)
        check(rc != 0, "self-test: the unit tests pass with the failure threshold at 50%")

    for f in failures:
        print("FAIL:", f)
    print(f"check_prometheus: {'%d failed' % len(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
