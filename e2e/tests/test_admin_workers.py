"""Workers at run time through the admin API (``/admin/workers`` on the
``--metrics-port`` listener, behind ``--admin-token-file``): while clients
keep sending requests — plain and streamed, through the OpenAI SDK — a
worker is added (it then serves: its own request counter moves), one is
drained under that load and leaves once idle, and one is deleted; not one
request fails. Also the token: none or a wrong one is 401, and a gateway
bound off loopback without a token file does not start."""

import subprocess
import threading

import httpx

from conftest import binary, clean_env, free_port, metric, start_engine, start_gateway, wait_until

TOKEN = "e2e-admin-token"
# Slow enough that a stream is in flight on a worker while it drains.
SLOW = ("--decode-per-step-us", "15000")


def admin_client(metrics_port: int, token: str | None = TOKEN) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"http://127.0.0.1:{metrics_port}", headers=headers, timeout=30)


def listed(admin: httpx.Client) -> dict:
    """The workers ``GET /admin/workers`` lists, by URL."""
    answer = admin.get("/admin/workers")
    assert answer.status_code == 200, answer.text
    return {w["url"]: w for w in answer.json()["workers"]}


def engine_requests(engine) -> float:
    """The engine's own ``iris_engine_requests_total``."""
    return metric(httpx.get(engine.metrics_url, timeout=10).text, "iris_engine_requests_total") or 0


class Load:
    """Clients sending requests in a loop (every other one streamed) until
    stopped; every failure is kept."""

    def __init__(self, client, model: str, threads: int = 4):
        self.client, self.model = client, model
        self.stop = threading.Event()
        self.done, self.failures = [], []
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, index: int):
        n = 0
        while not self.stop.is_set():
            stream = (n + index) % 2 == 0
            n += 1
            try:
                self.one(stream)
                self.done.append(stream)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                self.failures.append((stream, repr(e)))

    def one(self, stream: bool):
        messages = [{"role": "user", "content": "Tell me a story"}]
        if stream:
            chunks = list(self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=12, stream=True,
                extra_body={"ignore_eos": True}))
            assert chunks[-1].choices[0].finish_reason == "length", chunks[-1]
        else:
            answer = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=4, extra_body={"ignore_eos": True})
            assert answer.choices[0].finish_reason == "length", answer

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)


def test_workers_added_drained_and_deleted_under_load(model_dir, processes, tmp_path):
    token_file = tmp_path / "admin-token"
    token_file.write_text(f"{TOKEN}\n")
    first = start_engine(processes, model_dir, "aggregated", *SLOW)
    second = start_engine(processes, model_dir, "aggregated", *SLOW)
    extra = start_engine(processes, model_dir, "aggregated", "--metrics-port", "0", *SLOW)
    metrics_port = free_port()
    gateway = start_gateway(processes, model_dir, "--worker-urls", first.url, "--worker-urls",
                            second.url, "--metrics-port", str(metrics_port),
                            "--admin-token-file", token_file, "--health-check-interval-secs", "0.5")
    admin = admin_client(metrics_port)

    # The token: none or a wrong one is 401; the admin API is not on the API port.
    for client in (admin_client(metrics_port, None), admin_client(metrics_port, "nope")):
        refused = client.get("/admin/workers")
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["type"] == "authentication_error", refused.text
        client.close()
    assert gateway.http().get("/admin/workers").status_code == 404
    assert set(listed(admin)) == {first.url, second.url}

    with Load(gateway.client(), gateway.model) as load:
        wait_until(lambda: len(load.done) >= 8, 60, "requests before the changes")

        # Added: checked, in service at once, and it serves.
        added = admin.post("/admin/workers", json={"url": extra.url, "role": "aggregated",
                                                   "model": gateway.model})
        assert added.status_code == 201, added.text
        assert added.json()["worker"]["healthy"] is True, added.text
        wait_until(lambda: engine_requests(extra) >= 3, 60, "requests on the added worker")

        # Drained under load (requests in flight on it when asked, all but
        # surely: the in-process gateway test pins that case): listed as
        # draining, then gone.
        wait_until(lambda: listed(admin)[first.url]["in_flight"] > 0, 30, "load on the first worker")
        first_id = listed(admin)[first.url]["id"]
        drained = admin.post(f"/admin/workers/{first_id}/drain")
        assert drained.status_code == 202, drained.text
        assert drained.json()["worker"]["draining"] is True
        wait_until(lambda: first.url not in listed(admin), 60, "the drained worker to leave")

        # Deleted at once; its requests in flight finish.
        second_id = listed(admin)[second.url]["id"]
        deleted = admin.delete(f"/admin/workers/{second_id}")
        assert deleted.status_code == 200, deleted.text
        assert set(listed(admin)) == {extra.url}
        before = len(load.done)
        wait_until(lambda: len(load.done) >= before + 8, 60, "requests after the changes")

    assert not load.failures, load.failures[:5]
    assert any(load.done) and not all(load.done), "streams and plain requests both ran"
    served = listed(admin)[extra.url]
    assert served["requests"]["started"] >= 8 and served["requests"]["failed"] == 0, served
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    for action in ("add", "drain", "delete"):
        assert metric(text, "iris_admin_worker_changes_total", action=action, result="ok") == 1, action
    log = gateway.process.log_tail(200_000)
    for line in ("admin: worker added", "admin: worker draining", "admin: drained worker removed",
                 "admin: worker removed"):
        assert line in log, line
    assert TOKEN not in log, "the token is never logged"
    admin.close()


def test_an_open_admin_api_off_loopback_does_not_start(model_dir):
    done = subprocess.run([str(binary("iris")), "serve", "--host", "0.0.0.0", "--port", "0",
                           "--model-path", str(model_dir), "--worker-urls", "grpc://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60, env=clean_env())
    assert done.returncode == 1, done.stderr
    assert "--admin-token-file" in done.stderr, done.stderr
