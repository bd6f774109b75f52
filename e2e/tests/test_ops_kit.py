"""The operations kit (deploy/grafana, deploy/prometheus; docs/operations.md)
stays true to the code: every metric its dashboard and alert rules name is
one docs/metrics.md describes; the rules pass ``promtool check rules`` and
their unit tests (``promtool test rules``); every dashboard query is valid
PromQL; and a real Prometheus scraping a real EPD deployment (gateway with
API keys, encoder, prefill and decode engines) answers every dashboard
query without error — with data for every panel but those that show
failures — and evaluates every alert rule without error.

Needs Debian's ``prometheus`` package (``promtool`` and ``prometheus``;
.ci/run installs it through scripts/prereqs): missing, the tests FAIL.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from conftest import (REPO, STARTUP_TIMEOUT, Engine, Processes, binary, free_port, port_of,
                      start_engine, start_gateway, wait_until)
from test_epd import data_url, image_part, png

DASHBOARD = REPO / "deploy" / "grafana" / "iris.json"
ALERTS = REPO / "deploy" / "prometheus" / "iris-alerts.yaml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "iris-alerts.test.yaml"
METRICS_DOC = REPO / "docs" / "metrics.md"
OPERATIONS_DOC = REPO / "docs" / "operations.md"

# What issue 36 asks the alerts to watch, and the rules that do.
REQUIRED_ALERTS = {"IrisHighErrorRatio", "IrisTimeToFirstTokenHigh", "IrisWorkerCircuitOpen",
                   "IrisImageBudgetFull", "IrisTenantRateLimited"}
# Panels that show only failures (their queries keep only non-zero series,
# or the series appear once something failed): empty on a healthy run.
FAILURE_PANELS = {"Workers out of service", "Worker failures per second"}
METRIC = re.compile(r"\biris_[a-z0-9_]+\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def tool(name: str) -> str:
    """A program of Debian's ``prometheus`` package; fails when missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install -y prometheus (.ci/run installs it "
                    "through scripts/prereqs)")
    return path


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard."""
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p.get("targets", [])]


def alert_rules() -> list[dict]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def concrete(expr: str, rate_interval: str) -> str:
    """A dashboard query with Grafana's variables as Prometheus takes it:
    every model and tenant."""
    return (expr.replace("$__rate_interval", rate_interval)
            .replace("$model", ".*").replace("$tenant", ".*"))


def documented_metrics() -> set[str]:
    """Every metric name docs/metrics.md gives: the gateway's in full, the
    encoder's and the reference engine's after their sections' prefix."""
    text = METRICS_DOC.read_text()
    names = set(METRIC.findall(text))
    for heading, prefix in (("## Encoder", "iris_encoder_"), ("## Reference engine", "iris_engine_")):
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        names |= {prefix + word for word in re.findall(r"`([a-z][a-z0-9_]*)`", section)
                  if not word.startswith("iris_")}
    return names


def family(name: str, documented: set[str]) -> str:
    """The documented family a sample name belongs to (a histogram's
    ``_bucket``, ``_sum`` and ``_count`` belong to the histogram)."""
    if name in documented:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in documented:
            return name[: -len(suffix)]
    return name


def test_every_metric_the_kit_names_is_documented():
    documented = documented_metrics()
    assert "iris_requests_total" in documented and "iris_encoder_queue_wait_seconds" in documented
    exprs = [("dashboard: " + title, expr) for title, expr in dashboard_targets()]
    exprs += [("alert " + rule["alert"], rule["expr"]) for rule in alert_rules()]
    used, unknown = set(), []
    for where, expr in exprs:
        for name in METRIC.findall(expr):
            known = family(name, documented)
            used.add(known)
            if known not in documented:
                unknown.append(f"{where}: {name}")
    assert not unknown, "metrics not in docs/metrics.md:\n" + "\n".join(unknown)
    # The families the kit is about are all on it.
    for name in ("iris_requests_total", "iris_stage_duration_seconds",
                 "iris_time_per_output_token_seconds", "iris_worker_healthy",
                 "iris_worker_circuit_open", "iris_worker_in_flight", "iris_pixel_cache_lookups_total",
                 "iris_mm_inflight_bytes", "iris_mm_inflight_refusals_total",
                 "iris_rate_limited_total", "iris_auth_failures_total",
                 "iris_encoder_queue_wait_seconds", "iris_engine_requests_running"):
        assert name in used, f"{name} is on no panel and in no rule"


def test_the_dashboard_is_templated():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("model", "tenant"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        assert variables[name]["includeAll"] and variables[name]["multi"]
    ids, cells = set(), set()
    for panel in board["panels"]:
        assert panel["id"] not in ids, f"panel id {panel['id']} twice"
        ids.add(panel["id"])
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, f"{panel['title']} wider than the grid"
        covered = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                   for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            # Per-model families follow the model picker.
            if re.search(r"iris_(requests|stage|time_per|worker|prompt|completion|retries|lora)_",
                         target["expr"]):
                assert 'model=~"$model"' in target["expr"], f"{panel['title']}: {target['expr']}"


def test_the_alert_rules_pass_promtool(tmp_path):
    promtool = tool("promtool")
    rules = {rule["alert"]: rule for rule in alert_rules()}
    assert REQUIRED_ALERTS <= rules.keys(), REQUIRED_ALERTS - rules.keys()
    # Every rule's runbook is a section of docs/operations.md.
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.*)$", OPERATIONS_DOC.read_text(), re.M)}
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        runbook = rule["annotations"]["runbook"]
        assert runbook.startswith("docs/operations.md#"), name
        assert runbook.split("#", 1)[1] in anchors, f"{name}: no section {runbook}"
    checked = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout, checked.stdout
    # The unit tests, from their own directory (they name the rule file).
    tested = subprocess.run([promtool, "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent,
                            capture_output=True, text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Each alert is seen firing by some unit test.
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == rules.keys(), rules.keys() - fired


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each query as a recording rule's expression."""
    promtool = tool("promtool")
    rules = [{"record": f"iris_dashboard:query{i}", "expr": concrete(expr, "5m")}
             for i, (_, expr) in enumerate(dashboard_targets())]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert len(rules) >= 40


class Prometheus:
    """A real Prometheus server on loopback scraping ``targets`` every
    second and evaluating the alert rules every second."""

    def __init__(self, procs: Processes, root: Path, targets: list[str]):
        port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{"job_name": "iris", "static_configs": [{"targets": targets}]}],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{port}"
        self.process = procs.spawn("prometheus", [
            tool("prometheus"), f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"])
        wait_until(self.ready, 60, "prometheus ready", interval=0.2)
        self.targets = targets

    def ready(self) -> bool:
        if self.process.popen.poll() is not None:
            pytest.fail(f"prometheus exited:\n{self.process.log_tail()}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def api(self, path: str, **params) -> dict:
        answer = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert answer["status"] == "success", answer
        return answer["data"]

    def all_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return len(active) == len(self.targets) and all(t["health"] == "up" for t in active)


ENCODER_LINE = re.compile(r"iris-encoder listening grpc=(\S+) data=(\S+) metrics=(\S+)")


def start_encoder(procs: Processes, model_dir: Path) -> tuple[Engine, str]:
    """``iris-encoder`` (the vision tower) on free ports, and the address
    of its ``/metrics``."""
    args = [binary("iris-encoder"), "--host", "127.0.0.1", "--port", "0", "--bootstrap-port", "0",
            "--model-path", model_dir, "--metrics-port", "0", "--compute", "tower"]
    process = procs.spawn("encoder", args)
    match = process.wait_for_line(ENCODER_LINE, STARTUP_TIMEOUT)
    engine = Engine("encode", process, port_of(match.group(1)), port_of(match.group(2)))
    return engine, match.group(3)


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def test_a_real_prometheus_answers_the_kit_on_a_real_deployment(model_dir, tmp_path):
    open_key, limited_key = "sk-ops-open-0123456789", "sk-ops-limited-0123456789"
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[tenants]]\nname = "open"\nkeys = ["{digest(open_key)}"]\n\n'
                    f'[[tenants]]\nname = "limited"\nkeys = ["{digest(limited_key)}"]\n'
                    f'requests_per_minute = 1\n')
    procs = Processes(tmp_path)
    try:
        encoder, encoder_metrics = start_encoder(procs, model_dir)
        prefill = start_engine(procs, model_dir, "prefill", "--metrics-port", "0")
        decode = start_engine(procs, model_dir, "decode", "--metrics-port", "0")
        gateway = start_gateway(procs, model_dir, "--epd-disaggregation",
                                "--encode", encoder.url, str(encoder.data_port),
                                "--prefill", prefill.url, str(prefill.data_port),
                                "--decode", decode.url, "--api-keys-file", str(keys))
        targets = [f"127.0.0.1:{gateway.port}", encoder_metrics,
                   *(e.metrics_url.split("/")[2] for e in (prefill, decode))]
        prom = Prometheus(procs, tmp_path, targets)
        wait_until(prom.all_up, 30, "every target scraped", interval=0.5)

        drive(gateway, open_key, limited_key)
        # A few scrapes after the traffic, so that rates see it.
        time.sleep(4)
        check_dashboard(prom)
        check_rules(prom)
    finally:
        procs.stop_all()


def drive(gateway, open_key: str, limited_key: str):
    """Streamed chats with images (each stage, the encoder, the pixel
    cache), a 401 and a 429."""
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=open_key,
                           max_retries=0, timeout=60)
    images = [data_url(png(56, 56, seed=s)) for s in range(3)]
    for i in range(6):
        stream = client.chat.completions.create(
            model=gateway.model, stream=True, max_tokens=6, seed=i,
            extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": [{"type": "text", "text": f"Describe {i}."},
                                                   image_part(images[i % len(images)])]}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-wrong", max_retries=0,
                      timeout=30).models.list()
    limited = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=limited_key,
                            max_retries=0, timeout=30)
    ask = dict(model=gateway.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    limited.chat.completions.create(**ask)
    with pytest.raises(openai.RateLimitError):
        limited.chat.completions.create(**ask)
    client.close()
    limited.close()


def values(result: list[dict]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


def check_dashboard(prom: Prometheus):
    """Every query runs; every panel but the failure ones has a number."""
    empty = {}
    for title, expr in dashboard_targets():
        result = prom.api("query", query=concrete(expr, "1m"))["result"]
        numbers = [v for v in values(result) if not math.isnan(v)]
        if title not in FAILURE_PANELS:
            empty.setdefault(title, True)
            if numbers:
                empty[title] = False
    assert not [t for t, e in empty.items() if e], \
        f"panels without data: {[t for t, e in empty.items() if e]}"

    def one(expr: str) -> float:
        result = values(prom.api("query", query=expr)["result"])
        assert len(result) == 1, (expr, result)
        return result[0]

    # The numbers are the traffic's: 6 streamed chats, a 401, a 429.
    assert one('sum(iris_requests_total{outcome="ok"})') == 7
    assert one('sum(iris_rate_limited_total{tenant="limited",limit="requests_per_minute"})') == 1
    assert one('sum(iris_auth_failures_total{reason="unknown_key"})') == 1
    assert one("sum(iris_time_per_output_token_seconds_count)") == 6
    assert one('sum(iris_pixel_cache_lookups_total{result="hit"})') == 3
    assert one('sum(iris_worker_circuit_open)') == 0
    assert one('sum(iris_worker_healthy)') == 3


def check_rules(prom: Prometheus):
    """Every alert rule is loaded and evaluates without error; none fires
    on a healthy deployment."""
    names = {rule["alert"] for rule in alert_rules()}

    def evaluated():
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        done = [r for r in rules if not r["lastEvaluation"].startswith("0001-")]
        return rules if len(done) == len(names) else None

    rules = wait_until(evaluated, 30, "every alert rule evaluated", interval=0.5)
    assert {r["name"] for r in rules} == names
    for rule in rules:
        assert rule["health"] == "ok", rule
        assert rule["state"] == "inactive", rule
