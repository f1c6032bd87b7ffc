#!/usr/bin/env python3
"""Checks deploy/kubernetes against what straitd and the plugin actually accept.

Usage: check_kubernetes.py STRAITD DEPLOY_DIR

- every manifest parses and has the kind we ship (Namespace, ConfigMap, DaemonSet, StatefulSet,
  three Services, Job, PodDisruptionBudget, NetworkPolicy, ServiceMonitor, Kustomization, and
  the example Secret); the kustomization lists files that exist, names every manifest (listed
  or as a commented option), applies no Secret (the TLS Secret is created from real files), and
  `kubectl kustomize` builds it where kubectl is installed;
- the gateways (DaemonSet and StatefulSet) declare the WAN port the ConfigMap's wan.listen uses
  and the port `metrics` its metrics.listen uses (not a loopback address: the kubelet probes the
  pod IP); readiness is httpGet /readyz and liveness httpGet /healthz, startup httpGet /healthz
  (never /readyz, which fails while peers are down) or tcpSocket, each on a declared container
  port that is the metrics port; the pod template carries prometheus.io/scrape, port and path
  annotations for that port and /metrics; they mount the ConfigMap, the TLS Secret and the socket
  directory at the paths the config names, and render the config with an init container that
  runs `straitd --check-config`;
- the probe checks are real: copies of the DaemonSet with a wrong probe path, an undeclared
  probe port or a TCP readiness probe fail them;
- the Service selects the StatefulSet's pods and is its serviceName, on the WAN and metrics ports;
- the Secret holds every file the config's [tls] section names;
- the example Job sets NCCL_NET_PLUGIN=strait and every STRAIT_* variable, STRAIT_GATEWAY is the
  config's local.socket, LD_LIBRARY_PATH holds the directory the plugin is copied into, and its
  user is one the config's local.allowed_uids/gids lets in;
- the Job runs torchrun with --nnodes (a multiple of its pods), --nproc-per-node (its GPUs),
  --rdzv-backend=c10d, --rdzv-id and --rdzv-endpoint naming pod 0 of the Indexed Job through
  its subdomain's headless Service;
- the PodDisruptionBudget covers the pool and lets one gateway go; the NetworkPolicy selects
  both modes' pods, opens the WAN port only to CIDRs that hold every configured peer and the
  metrics port only to the namespace `monitoring`; the ServiceMonitor (monitoring.coreos.com/v1)
  selects the metrics Service, which selects both modes' pods, scrapes /metrics on its metrics
  port and names the scrape job as deploy/prometheus/strait-rules.yml's `up{job=...}` does;
  self-tests break the NetworkPolicy and the kustomization and expect failures;
- the ConfigMap's straitd.toml and deploy/examples/straitd.toml pass `straitd --check-config`
  (so every key used exists in the parser), and the same file with one misspelt key fails it
  (so the check is real).
Prints one line per failed check and exits 1 if any failed.
"""
import copy
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import yaml

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def load(path, many=False):
    """The YAML documents of `path` (exactly one unless `many`)."""
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if not many:
        check(len(docs) == 1, f"{path}: expected one YAML document, found {len(docs)}")
    return docs


def check_kustomization(kdir, files, run_kubectl=True):
    """kustomization.yaml: its resources exist, none is a Secret (the TLS Secret is made from
    real files with kubectl create secret; secret.example.yaml only shows its shape), and, where
    kubectl is installed, `kubectl kustomize` builds it. Returns the failures."""
    bad = []
    kust = files["kustomization.yaml"][0]
    for r in kust.get("resources", []):
        if not os.path.exists(os.path.join(kdir, r)):
            bad.append(f"kustomization lists missing file {r}")
            continue
        for o in files.get(r, []):
            if o["kind"] == "Secret":
                bad.append(f"kustomization applies Secret {o['metadata']['name']} from {r}: "
                           "placeholder keys must never be applied")
    text = open(os.path.join(kdir, "kustomization.yaml")).read()
    for name in files:
        if name not in ("kustomization.yaml", "job-example.yaml", "secret.example.yaml") and \
                name not in text:
            bad.append(f"kustomization.yaml neither lists nor mentions {name}")
    if "secret.example.yaml" not in files:
        bad.append("no secret.example.yaml showing the TLS Secret's shape")
    if run_kubectl and shutil.which("kubectl"):
        p = subprocess.run(["kubectl", "kustomize", kdir], capture_output=True, text=True,
                           timeout=60)
        if p.returncode != 0:
            bad.append(f"kubectl kustomize {kdir} failed: {p.stderr.strip()}")
        elif any(d and d.get("kind") == "Secret" for d in yaml.safe_load_all(p.stdout)):
            bad.append("kubectl kustomize's output holds a Secret")
    return bad


def render_daemonset(script, straitd, template, shards, node):
    """Runs the DaemonSet's render-config script with its paths moved into a scratch directory
    and `straitd` on PATH; returns (exit status, output, the rendered config)."""
    with tempfile.TemporaryDirectory() as d:
        tdir, edir, bindir = (os.path.join(d, x) for x in ("template", "etc", "bin"))
        for x in (tdir, edir, bindir):
            os.makedirs(x)
        with open(os.path.join(tdir, "straitd.toml"), "w") as f:
            f.write(template)
        with open(os.path.join(tdir, "shards"), "w") as f:
            f.write(shards)
        os.symlink(os.path.abspath(straitd), os.path.join(bindir, "straitd"))
        s = script.replace("/etc/strait-template", tdir).replace("/etc/strait/", edir + "/")
        if s.startswith("sh -c "):
            s = s[len("sh -c "):]
        env = dict(os.environ, NODE_NAME=node, PATH=bindir + ":" + os.environ.get("PATH", ""))
        r = subprocess.run(["sh", "-c", s], env=env, capture_output=True, text=True, timeout=30)
        rendered = ""
        if os.path.exists(os.path.join(edir, "straitd.toml")):
            with open(os.path.join(edir, "straitd.toml")) as f:
                rendered = f.read()
        return r.returncode, (r.stdout + r.stderr).strip(), rendered


def check_config(straitd, text, name):
    """Runs straitd --check-config on `text`; returns (exit status, output)."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        # The text only: the TLS files it names live in the pods, not here.
        r = subprocess.run([straitd, "--syntax-only", "--check-config", path],
                           capture_output=True, text=True,
                           timeout=30)
        return r.returncode, (r.stdout + r.stderr).strip()
    finally:
        os.unlink(path)


def container(pod_spec, name, init=False):
    key = "initContainers" if init else "containers"
    for c in pod_spec.get(key, []):
        if c["name"] == name:
            return c
    return None


def mount_path(c, volume):
    for m in c.get("volumeMounts", []):
        if m["name"] == volume:
            return m["mountPath"]
    return None


def volume(pod_spec, name):
    for v in pod_spec.get("volumes", []):
        if v["name"] == name:
            return v
    return None


def failures_of(fn, *args):
    """Runs fn(*args) with its own failure list; returns that list (the real one is untouched)."""
    global failures
    saved, failures = failures, []
    try:
        fn(*args)
        return failures
    finally:
        failures = saved


# Which HTTP path each probe of the gateway must ask; None: httpGet not required (tcpSocket or
# exec allowed), but if it is httpGet it must ask the given path.
PROBE_PATHS = {
    "readinessProbe": ("/readyz", True),
    "livenessProbe": ("/healthz", True),
    "startupProbe": ("/healthz", False),
}


def check_probes(where, c, ports, metrics_port):
    """The probes of container c: declared ports, HTTP paths (see PROBE_PATHS)."""
    for probe, (path, need_http) in PROBE_PATHS.items():
        p = c.get(probe)
        if not check(p is not None, f"{where}: straitd has no {probe}"):
            continue
        if "httpGet" in p:
            get = p["httpGet"]
            port = get.get("port")
            declared = port in ports or (isinstance(port, int) and port in ports.values())
            check(declared,
                  f"{where}: {probe} probes port {port!r}, which the container does not declare")
            number = ports.get(port, port)
            check(not declared or metrics_port is None or number == metrics_port,
                  f"{where}: {probe} probes port {port!r} ({number}), not the metrics port "
                  f"{metrics_port} where straitd serves HTTP")
            check(get.get("path") == path,
                  f"{where}: {probe} asks {get.get('path')!r}; it must ask {path}")
            check(get.get("scheme", "HTTP") == "HTTP",
                  f"{where}: {probe} uses scheme {get.get('scheme')}; straitd serves plain HTTP")
        elif need_http:
            check(False, f"{where}: {probe} is not httpGet {path} on the metrics port")
        elif "tcpSocket" in p:
            port = p["tcpSocket"]["port"]
            check(port in ports or port in ports.values(),
                  f"{where}: {probe} probes port {port!r}, which the container does not declare")
        else:
            check("exec" in p, f"{where}: {probe} is neither tcpSocket, httpGet nor exec")


def check_gateway(kind, obj, config, cm_name, secret):
    where = f"{kind} {obj['metadata']['name']}"
    pod = obj["spec"]["template"]["spec"]
    labels = obj["spec"]["template"]["metadata"]["labels"]
    sel = obj["spec"]["selector"]["matchLabels"]
    check(all(labels.get(k) == v for k, v in sel.items()),
          f"{where}: selector {sel} does not match the pod labels {labels}")
    c = container(pod, "straitd")
    if not check(c is not None, f"{where}: no container named straitd"):
        return
    wan_port = int(config["wan"]["listen"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(ports.get("wan") == wan_port,
          f"{where}: container port 'wan' is {ports.get('wan')}, the config listens on {wan_port}")
    # The HTTP server (metrics, probes) must exist and be reachable on the pod IP.
    metrics_listen = config.get("metrics", {}).get("listen")
    metrics_port = None
    if check(metrics_listen, f"{where}: the ConfigMap's straitd.toml has no [metrics] listen, "
             "so nothing serves /healthz and /readyz"):
        host, metrics_port = metrics_listen.rsplit(":", 1)
        metrics_port = int(metrics_port)
        check(not ipaddress.ip_address(host.strip("[]")).is_loopback,
              f"{where}: metrics.listen {metrics_listen} is loopback; the kubelet probes the "
              "pod IP (the node's, with hostNetwork)")
        check(ports.get("metrics") == metrics_port,
              f"{where}: container port 'metrics' is {ports.get('metrics')}, the config's "
              f"metrics.listen port is {metrics_port}")
    check_probes(where, c, ports, metrics_port)
    ann = obj["spec"]["template"]["metadata"].get("annotations", {})
    want_ann = {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics"}
    if metrics_port is not None:
        want_ann["prometheus.io/port"] = str(metrics_port)
    for k, v in want_ann.items():
        check(ann.get(k) == v,
              f"{where}: pod template annotation {k} is {ann.get(k)!r}, expected {v!r}")
    # The config file straitd reads is the one the init container rendered.
    args = c.get("args", []) + c.get("command", [])
    check("--config" in args, f"{where}: straitd is not started with --config")
    config_file = args[args.index("--config") + 1] if "--config" in args else ""
    render = container(pod, "render-config", init=True)
    if check(render is not None, f"{where}: no init container render-config"):
        script = " ".join(render.get("command", []) + render.get("args", []))
        check(f"--check-config {config_file}" in script,
              f"{where}: render-config does not run straitd --check-config {config_file}")
        tmpl = volume(pod, "config-template")
        check(tmpl is not None and tmpl.get("configMap", {}).get("name") == cm_name,
              f"{where}: volume config-template is not ConfigMap {cm_name}")
        check(mount_path(render, "config") == os.path.dirname(config_file),
              f"{where}: render-config does not write into {os.path.dirname(config_file)}")
    check(mount_path(c, "config") == os.path.dirname(config_file),
          f"{where}: straitd does not mount the rendered config at {os.path.dirname(config_file)}")
    # TLS files at the paths the config names, from the Secret.
    tls = volume(pod, "tls")
    if check(tls is not None and tls.get("secret", {}).get("secretName") ==
             secret["metadata"]["name"], f"{where}: volume tls is not Secret "
             f"{secret['metadata']['name']}"):
        tls_dir = mount_path(c, "tls")
        for key in ("ca", "cert", "key"):
            path = config["tls"][key]
            check(os.path.dirname(path) == tls_dir,
                  f"{where}: tls.{key} = {path} is not under the Secret's mount {tls_dir}")
    # The local socket's directory is the node's, shared with the training pods.
    sock_dir = os.path.dirname(config["local"]["socket"])
    sv = volume(pod, "socket-dir")
    check(sv is not None and sv.get("hostPath", {}).get("path") == sock_dir,
          f"{where}: volume socket-dir is not hostPath {sock_dir}")
    check(mount_path(c, "socket-dir") == sock_dir,
          f"{where}: straitd does not mount socket-dir at {sock_dir}")
    check(pod.get("hostNetwork") is True,
          f"{where}: hostNetwork is not true (peers are configured by node address)")
    sc = pod.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True, f"{where}: pod does not set runAsNonRoot")
    check(c.get("securityContext", {}).get("allowPrivilegeEscalation") is False,
          f"{where}: straitd may escalate privileges")
    return sc


def main():
    straitd, deploy = sys.argv[1], sys.argv[2]
    kdir = os.path.join(deploy, "kubernetes")
    # file -> its documents; kind -> [(file, object)]. Only job-example.yaml holds two (the
    # training Job and its rendezvous Service); every other file is one object.
    files = {}
    by_kind = {}
    for name in sorted(os.listdir(kdir)):
        if name.endswith(".yaml"):
            files[name] = load(os.path.join(kdir, name), many=name == "job-example.yaml")
            for o in files[name]:
                by_kind.setdefault(o["kind"], []).append((name, o))
    want = {"Namespace": 1, "ConfigMap": 1, "Secret": 1, "DaemonSet": 1, "StatefulSet": 1,
            "Service": 3, "Job": 1, "Kustomization": 1, "PodDisruptionBudget": 1,
            "NetworkPolicy": 1, "ServiceMonitor": 1}
    have = {k: len(v) for k, v in by_kind.items()}
    check(have == want, f"manifest kinds {have}; expected {want}")
    if failures:
        return report()
    kinds = {k: v[0] for k, v in by_kind.items()}
    services = {o["metadata"]["name"]: (f, o) for f, o in by_kind["Service"]}

    failures.extend(check_kustomization(kdir, files))

    cm = kinds["ConfigMap"][1]
    text = cm["data"]["straitd.toml"]
    config = tomllib.loads(text)
    rc, out = check_config(straitd, text, "configmap")
    check(rc == 0, f"ConfigMap straitd.toml fails straitd --check-config: {out}")
    # The init containers replace this line; it must be there exactly once.
    check(sum(1 for l in text.splitlines() if l.startswith("shard_index = ")) == 1,
          "ConfigMap straitd.toml has no single 'shard_index = ' line for render-config")
    bad = text.replace("[link]\n", "[link]\nstreems = 4\n", 1)
    check(bad != text, "ConfigMap straitd.toml has no [link] section for the negative check")
    rc, out = check_config(straitd, bad, "misspelt")
    check(rc != 0 and "streems" in out,
          f"straitd --check-config accepted a misspelt key (rc {rc}): {out}")
    with open(os.path.join(deploy, "examples", "straitd.toml")) as f:
        rc, out = check_config(straitd, f.read(), "example")
    check(rc == 0, f"deploy/examples/straitd.toml fails straitd --check-config: {out}")

    secret = kinds["Secret"][1]
    for key in ("ca", "cert", "key"):
        fname = os.path.basename(config["tls"][key])
        check(fname in secret.get("stringData", {}) or fname in secret.get("data", {}),
              f"Secret has no key {fname} (tls.{key})")
    check("BEGIN PRIVATE KEY-----\n" not in str(secret) or "REPLACE" in str(secret),
          "secret.example.yaml holds what looks like a real key; it must stay a template")

    ds = kinds["DaemonSet"][1]
    ss = kinds["StatefulSet"][1]
    check_gateway("DaemonSet", ds, config, cm["metadata"]["name"], secret)
    check_gateway("StatefulSet", ss, config, cm["metadata"]["name"], secret)
    # The probe checks must be able to fail: break the DaemonSet's probes one way at a time.
    def broken(mutate):
        bad = copy.deepcopy(ds)
        mutate(container(bad["spec"]["template"]["spec"], "straitd"))
        return failures_of(check_gateway, "DaemonSet", bad, config, cm["metadata"]["name"],
                           secret)
    mutations = {
        "readiness path /healthz": lambda c: c["readinessProbe"]["httpGet"].update(
            path="/healthz"),
        "liveness on an undeclared port": lambda c: c["livenessProbe"]["httpGet"].update(
            port="metricz"),
        "readiness tcpSocket on wan": lambda c: c.update(
            readinessProbe={"tcpSocket": {"port": "wan"}}),
        "startup on /readyz": lambda c: c["startupProbe"].update(
            httpGet={"path": "/readyz", "port": "metrics"}),
    }
    for what, mutate in mutations.items():
        try:
            caught = broken(mutate)
        except (KeyError, TypeError) as e:  # a probe is not httpGet as the mutation expects
            check(False, f"self-test '{what}': the DaemonSet's probes are not httpGet ({e!r})")
            continue
        check(caught, f"self-test: a DaemonSet with {what} passes the probe checks")
    # Sidecar mode needs the node -> shard map the init container reads.
    ds_script = " ".join(container(ds["spec"]["template"]["spec"], "render-config", True)
                         ["command"])
    check("shards" in ds_script and "shards" in cm["data"],
          "DaemonSet render-config or ConfigMap lacks the node -> shard map `shards`")
    for line in cm["data"].get("shards", "").splitlines():
        parts = line.split()
        check(len(parts) == 2 and re.fullmatch(r"\d+(-\d+)?", parts[1]) is not None,
              f"ConfigMap shards: bad line {line!r}")
    # The render script itself, run here on the ConfigMap's text: a node with a range of shards
    # gets `shards = "a-b"` and no table of its own region's gateways, one with an index keeps
    # both; each result passes --check-config, and a node without a line fails.
    region = config["region"]
    for node, want, own_table in (("n-range", 'shards = "0-1"', False),
                                  ("n-one", "shard_index = 1", True)):
        rc, out, rendered = render_daemonset(ds_script, straitd, text,
                                             "n-range 0-1\nn-one 1\n", node)
        if check(rc == 0, f"DaemonSet render-config fails for node {node}: {out}"):
            check(want in rendered.splitlines(),
                  f"DaemonSet render-config for {node}: no line {want!r} in:\n{rendered}")
            check((f"[peers.{region}]" in rendered) == own_table,
                  f"DaemonSet render-config for {node}: [peers.{region}] "
                  f"{'dropped' if own_table else 'kept'}:\n{rendered}")
    rc, out, _ = render_daemonset(ds_script, straitd, text, "n-range 0-1\n", "n-missing")
    check(rc != 0 and "has no line" in out,
          f"DaemonSet render-config passes for a node without a shards line (rc {rc}): {out}")

    svc = services["straitd"][1]
    pool_labels = ss["spec"]["template"]["metadata"]["labels"]
    check(all(pool_labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
          "Service selector does not select the StatefulSet's pods")
    check(ss["spec"]["serviceName"] == svc["metadata"]["name"],
          "StatefulSet serviceName is not the Service")
    wan_port = int(config["wan"]["listen"].rsplit(":", 1)[1])
    check(any(p["port"] == wan_port and p.get("targetPort") in ("wan", wan_port)
              for p in svc["spec"]["ports"]), f"Service has no port {wan_port} -> wan")
    if config.get("metrics", {}).get("listen"):
        mport = int(config["metrics"]["listen"].rsplit(":", 1)[1])
        check(any(p["port"] == mport and p.get("targetPort") in ("metrics", mport)
                  for p in svc["spec"]["ports"]), f"Service has no port {mport} -> metrics")
    check(ss["spec"]["replicas"] == max(1, len(config["peers"].get(config["region"], {}))),
          "StatefulSet replicas differ from the number of [peers.<own region>] gateways")

    job = kinds["Job"][1]
    jpod = job["spec"]["template"]["spec"]
    train = jpod["containers"][0]
    env = {e["name"]: e.get("value") for e in train.get("env", [])}
    check(env.get("NCCL_NET_PLUGIN") == "strait", "Job does not set NCCL_NET_PLUGIN=strait")
    for var in ("STRAIT_REGION", "STRAIT_GATEWAY", "STRAIT_JOB_ID", "STRAIT_COMPRESSION"):
        check(env.get(var), f"Job does not set {var}")
    check(env.get("STRAIT_REGION") == config["region"],
          f"Job's STRAIT_REGION {env.get('STRAIT_REGION')} is not the gateway's region")
    check(env.get("STRAIT_GATEWAY") == config["local"]["socket"],
          f"Job's STRAIT_GATEWAY {env.get('STRAIT_GATEWAY')} is not local.socket")
    check(env.get("STRAIT_COMPRESSION") in ("auto", "none", "zstd", "int8", "int4", "fp8"),
          "Job's STRAIT_COMPRESSION is not a value the plugin accepts")
    lib_dir = mount_path(train, "strait-lib")
    check(lib_dir and lib_dir in (env.get("LD_LIBRARY_PATH") or "").split(":"),
          "Job's LD_LIBRARY_PATH does not hold the plugin's directory")
    init = container(jpod, "strait-plugin", init=True)
    check(init is not None and mount_path(init, "strait-lib") == lib_dir and
          "libnccl-net-strait.so" in " ".join(init["command"]),
          "Job has no init container copying libnccl-net-strait.so into the plugin directory")
    # The plugin finds libuv.so.1 beside itself (RUNPATH $ORIGIN); the training image may lack it.
    check(init is not None and "libuv.so.1" in " ".join(init["command"]),
          "Job's init container does not copy libuv.so.1 beside the plugin (its one shared "
          "dependency besides glibc)")
    check(mount_path(train, "strait-socket") == os.path.dirname(config["local"]["socket"]),
          "Job does not mount the gateway's socket directory")
    jsc = jpod.get("securityContext", {})
    check(jsc.get("runAsUser") in config["local"].get("allowed_uids", []) or
          jsc.get("runAsGroup") in config["local"].get("allowed_gids", []),
          "Job's runAsUser/runAsGroup is not in local.allowed_uids/allowed_gids")
    gw_gid = ds["spec"]["template"]["spec"]["securityContext"].get("runAsGroup")
    check(gw_gid in jsc.get("supplementalGroups", []),
          f"Job lacks supplemental group {gw_gid} needed for the 0660 socket")
    job_services = {o["metadata"]["name"]: o for f, o in by_kind["Service"]
                    if f == "job-example.yaml"}
    failures.extend(check_torchrun(job, job_services))

    gateway_pods = {"DaemonSet": ds["spec"]["template"], "StatefulSet": ss["spec"]["template"]}
    pdb = kinds["PodDisruptionBudget"][1]
    check(selects(pdb["spec"]["selector"], ss["spec"]["template"]),
          "PodDisruptionBudget does not select the StatefulSet's pods")
    check(("maxUnavailable" in pdb["spec"]) != ("minAvailable" in pdb["spec"]),
          "PodDisruptionBudget sets neither or both of maxUnavailable and minAvailable")
    check(pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable", 0) >= 1,
          "PodDisruptionBudget lets more than one gateway go (or none stay)")
    netpol = kinds["NetworkPolicy"][1]
    failures.extend(check_network_policy(netpol, gateway_pods, config))
    # Self-test: a policy that forgets one peer region, and one open to every source.
    narrow = copy.deepcopy(netpol)
    for rule in narrow["spec"]["ingress"]:
        rule["from"] = [f for f in rule["from"] if f.get("ipBlock", {}).get("cidr") !=
                        "198.51.100.0/24"]
    check(any("198.51.100.10" in f for f in check_network_policy(narrow, gateway_pods, config)),
          "self-test: a NetworkPolicy without eu-west's CIDR passes")
    wide = copy.deepcopy(netpol)
    wide["spec"]["ingress"][0].pop("from")
    check(check_network_policy(wide, gateway_pods, config),
          "self-test: a NetworkPolicy open to every source passes")
    failures.extend(check_service_monitor(kinds["ServiceMonitor"][1], services, gateway_pods,
                                          deploy))
    # Self-test: the kustomization check catches a placeholder Secret among the resources.
    bad = copy.deepcopy(files)
    bad["kustomization.yaml"][0]["resources"].append("secret.example.yaml")
    check(any("placeholder" in f for f in check_kustomization(kdir, bad, run_kubectl=False)),
          "self-test: a kustomization applying secret.example.yaml passes")
    return report()


def selects(selector, pod_template):
    """Whether a label selector (matchLabels or a Service's plain map) selects the pods."""
    want = selector.get("matchLabels", selector) if isinstance(selector, dict) else {}
    labels = pod_template["metadata"]["labels"]
    return bool(want) and all(labels.get(k) == v for k, v in want.items())


def check_torchrun(job, services):
    """The training container runs torchrun with c10d rendezvous whose endpoint is pod 0 of the
    Indexed Job, named through a headless Service. Returns the failures."""
    bad = []
    pod = job["spec"]["template"]["spec"]
    train = pod["containers"][0]
    env = {e["name"]: e.get("value", "") for e in train.get("env", [])}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
            for a in train.get("command", []) + train.get("args", [])]
    if not argv or argv[0] != "torchrun":
        return [f"Job's container does not run torchrun: {argv}"]
    flags = {}
    for a in argv[1:]:
        if not a.startswith("--"):
            break
        k, _, v = a.partition("=")
        flags[k] = v
    for k in flags:
        if "_" in k:
            bad.append(f"torchrun flag {k}: torchrun's options are spelt with '-'")
    if flags.get("--rdzv-backend") != "c10d":
        bad.append(f"torchrun --rdzv-backend is {flags.get('--rdzv-backend')!r}, not c10d")
    if not flags.get("--rdzv-id"):
        bad.append("torchrun has no --rdzv-id (every region's Job must share one)")
    try:
        nnodes = int(flags.get("--nnodes", ""))
    except ValueError:
        nnodes = 0
        bad.append(f"torchrun --nnodes {flags.get('--nnodes')!r} is not a fixed node count")
    par = job["spec"].get("parallelism", 1)
    if nnodes and (nnodes < par or nnodes % par):
        bad.append(f"torchrun --nnodes={nnodes} is not a multiple of this region's {par} pods")
    gpus = train.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if str(flags.get("--nproc-per-node")) != str(gpus):
        bad.append(f"torchrun --nproc-per-node={flags.get('--nproc-per-node')} but the pod has "
                   f"{gpus} GPUs")
    host, _, port = flags.get("--rdzv-endpoint", "").rpartition(":")
    if not host or not port.isdigit():
        bad.append(f"torchrun --rdzv-endpoint {flags.get('--rdzv-endpoint')!r} is not host:port")
        return bad
    # Pod 0 of an Indexed Job is <job>-0; with `subdomain` and a headless Service of that name
    # it is <job>-0.<subdomain>.<namespace>.svc...
    name, ns = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    sub = pod.get("subdomain")
    want = f"{name}-0.{sub}.{ns}.svc"
    if job["spec"].get("completionMode") != "Indexed":
        bad.append("Job is not Indexed: its pods have no stable host names for --rdzv-endpoint")
    if not sub or not (host == f"{name}-0.{sub}" or host.startswith(want)):
        bad.append(f"torchrun --rdzv-endpoint host {host} is not pod 0 ({want}...)")
    svc = services.get(sub)
    if svc is None:
        bad.append(f"no headless Service {sub} beside the Job for the pods' DNS names")
    else:
        if svc["spec"].get("clusterIP") != "None":
            bad.append(f"Service {sub} is not headless (clusterIP: None)")
        if not selects(svc["spec"].get("selector", {}), job["spec"]["template"]):
            bad.append(f"Service {sub} does not select the Job's pods")
        if not any(p.get("containerPort") == int(port) for p in train.get("ports", [])):
            bad.append(f"the training container does not declare port {port}")
    return bad


def check_network_policy(np, gateway_pods, config):
    """Ingress only: the WAN port from CIDRs holding every configured peer, the metrics port from
    the monitoring namespace, nothing else. Returns the failures."""
    bad = []
    spec = np["spec"]
    for kind, tpl in gateway_pods.items():
        if not selects(spec.get("podSelector", {}), tpl):
            bad.append(f"NetworkPolicy does not select the {kind}'s pods")
    if "Ingress" not in spec.get("policyTypes", []):
        bad.append("NetworkPolicy does not restrict Ingress")
    wan_port = int(config["wan"]["listen"].rsplit(":", 1)[1])
    mport = int(config["metrics"]["listen"].rsplit(":", 1)[1])
    wan_cidrs = []
    metrics_ok = False
    for rule in spec.get("ingress", []):
        ports = {p.get("port") for p in rule.get("ports", [])}
        if not rule.get("from") or not ports:
            bad.append(f"NetworkPolicy ingress rule open to every source or port: {rule}")
            continue
        if ports <= {"wan", wan_port}:
            for f in rule["from"]:
                if set(f) != {"ipBlock"}:
                    bad.append(f"NetworkPolicy: the WAN port is open to {f}, not a CIDR")
                else:
                    wan_cidrs.append(ipaddress.ip_network(f["ipBlock"]["cidr"]))
        elif ports <= {"metrics", mport}:
            for f in rule["from"]:
                ns = f.get("namespaceSelector", {}).get("matchLabels", {})
                if set(f) != {"namespaceSelector"} or \
                        ns != {"kubernetes.io/metadata.name": "monitoring"}:
                    bad.append(f"NetworkPolicy: the metrics port is open to {f}, not the "
                               "monitoring namespace")
                else:
                    metrics_ok = True
        else:
            bad.append(f"NetworkPolicy opens ports {sorted(map(str, ports))} beyond wan/metrics")
    if not metrics_ok:
        bad.append("NetworkPolicy does not let the monitoring namespace reach the metrics port")
    for region, shards in config["peers"].items():
        for shard, addr in shards.items():
            ip = ipaddress.ip_address(addr.rsplit(":", 1)[0])
            if not any(ip in c for c in wan_cidrs):
                bad.append(f"NetworkPolicy: peer {region}.{shard} {ip} is in no CIDR allowed "
                           "on the WAN port")
    return bad


def check_service_monitor(sm, services, gateway_pods, deploy):
    """monitoring.coreos.com/v1 ServiceMonitor: selects the metrics Service (which selects both
    modes' pods), scrapes its metrics port at /metrics, and names the scrape job as the alert
    rules expect. Returns the failures."""
    bad = []
    if sm.get("apiVersion") != "monitoring.coreos.com/v1":
        bad.append(f"ServiceMonitor apiVersion is {sm.get('apiVersion')}")
    spec = sm["spec"]
    chosen = [o for _, o in services.values()
              if all(o["metadata"].get("labels", {}).get(k) == v
                     for k, v in spec["selector"].get("matchLabels", {}).items())
              and o["metadata"]["namespace"] in spec.get("namespaceSelector", {})
              .get("matchNames", [sm["metadata"]["namespace"]])]
    if len(chosen) != 1:
        return bad + [f"ServiceMonitor selects {len(chosen)} Services; expected the metrics one"]
    svc = chosen[0]
    for kind, tpl in gateway_pods.items():
        if not selects(svc["spec"]["selector"], tpl):
            bad.append(f"Service {svc['metadata']['name']} does not select the {kind}'s pods")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for ep in spec.get("endpoints", []):
        p = ports.get(ep.get("port"))
        if p is None or p.get("targetPort") != "metrics":
            bad.append(f"ServiceMonitor endpoint port {ep.get('port')} is not the Service's "
                       "port to `metrics`")
        if ep.get("path", "/metrics") != "/metrics":
            bad.append(f"ServiceMonitor scrapes {ep.get('path')}, not /metrics")
    if not spec.get("endpoints"):
        bad.append("ServiceMonitor has no endpoints")
    # The operator names the job after the Service's jobLabel label, else the Service.
    job = svc["metadata"].get("labels", {}).get(spec.get("jobLabel", ""),
                                                 svc["metadata"]["name"])
    with open(os.path.join(deploy, "prometheus", "strait-rules.yml")) as f:
        rules_jobs = set(re.findall(r'up\{job="([^"]+)"', f.read()))
    if rules_jobs != {job}:
        bad.append(f"the ServiceMonitor's scrape job is {job!r} but strait-rules.yml asks "
                   f"up{{job={sorted(rules_jobs)}}}")
    return bad


def report():
    for f in failures:
        print("FAIL:", f)
    print(f"check_kubernetes: {'%d failed' % len(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
