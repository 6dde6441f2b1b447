#!/usr/bin/env python3
"""Checks charts/strata: renders it with a real Helm engine for the default and the production
values, then runs yamllint, kubernetes-validate (strict schemas), checkov and promtool (the
PrometheusRule) on what it renders, checks that bad values are refused, and starts a real
stratad on the config the chart's ConfigMap carries. promtool also checks and unit-tests the
alerting rules file (charts/strata/alerts) directly.

The Helm engine (PyPI helm-python-sdk: Helm's Go SDK behind a C ABI), kubernetes-validate and
checkov come from a virtualenv that charts/check.sh creates (default ~/.cache/strata-chart-venv,
or $STRATA_CHART_VENV). Without it only yamllint runs on the values files and the script exits
77 (ctest: skipped). With --require, a missing tool is a failure.

usage: chart_check.py --stratad PATH [--require] [--out DIR]
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "charts", "strata")
YAMLLINT_CONFIG = os.path.join(ROOT, "charts", ".yamllint")
# Rendered manifests embed the dashboard JSON and image digests: every rule but line length.
# Helm's toYaml does not indent sequences under their key; both styles pass.
RENDERED_YAMLLINT = ("{extends: default, rules: {line-length: disable, document-start: disable, "
                     "truthy: {check-keys: false}, indentation: {indent-sequences: whatever}}}")
VALUES = {"default": None, "production": os.path.join(CHART, "values-production.yaml")}
VENV = os.environ.get("STRATA_CHART_VENV", os.path.expanduser("~/.cache/strata-chart-venv"))
SKIP = 77

failures = []


def note(msg):
    print(msg, flush=True)


def fail(msg):
    failures.append(msg)
    note("FAIL " + msg)


def run(cmd, **kw):
    note("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    out = (r.stdout + r.stderr).strip()
    if out:
        note(out)
    return r.returncode, out


def venv_bin(name):
    path = os.path.join(VENV, "bin", name)
    return path if os.access(path, os.X_OK) else None


def maybe_reexec_in_venv():
    try:
        import helm_python  # noqa: F401
        return
    except ImportError:
        pass
    py = venv_bin("python")
    if py and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(py, [py] + sys.argv)


def render(values_file, out_path):
    import yaml
    from helm_python import chart as helm_chart

    chart = helm_chart.Chart.load(CHART)
    values = yaml.safe_load(open(values_file)) if values_file else None
    rendered = chart.render(values, name="strata", namespace="strata", is_install=True)
    docs = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt") or not rendered[path].strip():
            continue
        for doc in rendered[path].split("\n---\n"):
            doc = doc.strip("\n")
            if doc.strip("- \n"):
                docs.append("# Source: %s\n%s\n" % (path, doc.lstrip("-\n")))
    with open(out_path, "w") as f:
        f.write("---\n" + "---\n".join(docs))
    return [yaml.safe_load(d) for d in docs]


def check_config_with_stratad(stratad, manifests, label, work):
    """Starts stratad on the chart's stratad.yaml (secret path and ports pointed at a sandbox)."""
    import yaml

    cms = [m for m in manifests if m and m.get("kind") == "ConfigMap" and "stratad.yaml" in
           m.get("data", {})]
    if len(cms) != 1:
        fail("%s: expected one ConfigMap with stratad.yaml, found %d" % (label, len(cms)))
        return
    config = yaml.safe_load(cms[0]["data"]["stratad.yaml"])
    secret = os.path.join(work, label + "-secret")
    with open(secret, "w") as f:
        f.write("x" * 32 + "\n")
    config["cluster_secret_file"] = secret
    config["host_tier"]["capacity"] = "64MiB"  # the node's size, not this machine's
    path = os.path.join(work, label + "-stratad.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    ready = os.path.join(work, label + "-ready.json")
    cmd = [stratad, "--config", path, "--listen", "127.0.0.1:0", "--http-listen",
           "127.0.0.1:0", "--data-dir", os.path.join(work, label + "-data"),
           "--ready-file", ready]
    note("$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 20
    while time.time() < deadline and not os.path.exists(ready) and proc.poll() is None:
        time.sleep(0.05)
    if os.path.exists(ready):
        note("%s: stratad started on the chart's config: %s" % (label, open(ready).read().strip()))
        proc.send_signal(signal.SIGTERM)
        if proc.wait(timeout=30) != 0:
            fail("%s: stratad did not drain cleanly" % label)
    else:
        proc.kill()
        fail("%s: stratad refused the chart's config:\n%s" % (label, proc.communicate()[0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stratad", required=True)
    ap.add_argument("--require", action="store_true", help="a missing tool is a failure")
    ap.add_argument("--out", help="keep the rendered manifests here")
    args = ap.parse_args()
    maybe_reexec_in_venv()

    yamllint = shutil.which("yamllint") or venv_bin("yamllint")
    if yamllint:
        code, _ = run([yamllint, "-s", "-c", YAMLLINT_CONFIG, os.path.join(CHART, "Chart.yaml"),
                       os.path.join(CHART, "values.yaml"), VALUES["production"],
                       os.path.join(CHART, "alerts", "strata-alerts.yaml"),
                       os.path.join(CHART, "alerts", "strata-alerts_test.yaml")])
        if code:
            fail("yamllint on the values files")
    elif args.require:
        fail("yamllint not installed")

    import json
    dashboard = os.path.join(CHART, "dashboards", "strata-overview.json")
    try:
        with open(dashboard) as f:
            panels = json.load(f)["panels"]
        note("dashboard: valid JSON, %d panels" % len(panels))
    except (OSError, ValueError, KeyError) as e:
        fail("dashboard %s: %s" % (dashboard, e))

    promtool = shutil.which("promtool")
    alerts = os.path.join(CHART, "alerts")
    if promtool:
        if run([promtool, "check", "rules", os.path.join(alerts, "strata-alerts.yaml")])[0]:
            fail("promtool check rules")
        if run([promtool, "test", "rules", "strata-alerts_test.yaml"], cwd=alerts)[0]:
            fail("promtool test rules")
    elif args.require:
        fail("promtool not installed")
    else:
        note("SKIP promtool: not installed")

    try:
        import helm_python  # noqa: F401
    except ImportError:
        msg = "no Helm engine (run charts/check.sh to create %s)" % VENV
        if args.require:
            fail(msg)
            return 1
        else:
            note("SKIP rendering: " + msg)
            return 1 if failures else SKIP

    from helm_python import chart as helm_chart

    work = args.out or tempfile.mkdtemp(prefix="strata-chart-")
    os.makedirs(work, exist_ok=True)
    rendered_files = []
    for label, values_file in VALUES.items():
        import yaml

        lint = helm_chart.lint(CHART, yaml.safe_load(open(values_file)) if values_file else None,
                               strict=True, namespace="strata")
        bad = [m for m in lint.get("messages", []) if m.get("severity", 0) >= 2]
        note("helm lint (%s): %s" % (label, lint))
        if bad or lint.get("errors"):
            fail("helm lint --strict (%s)" % label)
        out = os.path.join(work, label + ".yaml")
        try:
            manifests = render(values_file, out)
        except Exception as e:  # a template error names the template and line
            fail("render (%s): %s" % (label, e))
            continue
        note("rendered %s: %d objects: %s" % (label, len(manifests), ", ".join(
            sorted("%s/%s" % (m["kind"], m["metadata"]["name"]) for m in manifests if m))))
        rendered_files.append(out)
        for m in manifests:
            if m and m.get("kind") == "PrometheusRule" and promtool:
                rules = os.path.join(work, label + "-prometheusrule-spec.yaml")
                with open(rules, "w") as f:
                    yaml.safe_dump(m["spec"], f)
                if run([promtool, "check", "rules", rules])[0]:
                    fail("promtool check rules on the rendered PrometheusRule (%s)" % label)
        check_config_with_stratad(args.stratad, manifests, label, work)

    # Values the schema (values.schema.json) or the templates must refuse.
    for label, bad in (("port out of range", {"ports": {"grpc": 7420, "http": 70000}}),
                       ("unknown nvme.type", {"nvme": {"enabled": True, "type": "nfs"}}),
                       ("chart-owned config field", {"config": {"listen": "0.0.0.0:1"}}),
                       ("misspelt top-level key", {"hostNetwrok": True}),
                       ("tls without a Secret", {"tls": {"enabled": True}}),
                       ("client certificates required but not verified",
                        {"tls": {"enabled": True, "existingSecret": "s",
                                 "requireClientCert": True}})):
        try:
            helm_chart.Chart.load(CHART).render(bad, name="strata", namespace="strata")
            fail("values with a %s were accepted" % label)
        except Exception as e:  # HelmValuesError or HelmRenderError
            detail = " ".join(l.strip() for l in str(e).splitlines()[1:4])
            note("refused as expected (%s): %s" % (label, detail[:200]))

    if yamllint and rendered_files:
        if run([yamllint, "-s", "-d", RENDERED_YAMLLINT] + rendered_files)[0]:
            fail("yamllint on the rendered manifests")

    kv = venv_bin("kubernetes-validate") or shutil.which("kubernetes-validate")
    if kv:
        for version in ("1.30.0", "1.37.0"):
            code, out = run([kv, "--strict", "-k", version] + rendered_files)
            if code:
                fail("kubernetes-validate --strict -k %s" % version)
    elif args.require:
        fail("kubernetes-validate not installed")
    else:
        note("SKIP kubernetes-validate: not installed")

    checkov = venv_bin("checkov") or shutil.which("checkov")
    if checkov:
        code, out = run([checkov, "--framework", "kubernetes", "--compact", "--quiet",
                         "--skip-download", "-d", work], env=dict(os.environ, LOG_LEVEL="ERROR"))
        if code:
            fail("checkov")
    elif args.require:
        fail("checkov not installed")
    else:
        note("SKIP checkov: not installed")

    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    note("chart check: %d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
