"""Many models behind one ``iris serve --config iris.toml``: two tiny models
of different families (vocabularies and chat templates) on their own
reference engines, driven with the OpenAI SDK (interleaved streams), an
unknown model in both APIs' error shapes, ``/v1/models``, a reload by
``SIGHUP`` that adds and removes a model, a bad file refused at reload and
at start (naming file, line and key), and a flag and the file setting the
same thing refused naming both; and the two models plus a LoRA adapter of
one, served from one file while a worker is added and one drained under
load, then the file reloaded with a second adapter."""

import signal
import subprocess
import threading
from pathlib import Path

import httpx
import openai
import pytest

from conftest import (STARTUP_TIMEOUT, Gateway, binary, clean_env, free_port, metric,
                      readiness, start_engine, wait_until)
from test_admin_workers import SLOW, TOKEN, Load, admin_client, engine_requests
from test_admin_workers import listed as listed_workers


def write_model(family: str, path: Path) -> Path:
    subprocess.run([str(binary("iris")), "tiny-model", "--family", family, str(path)],
                   check=True, stdout=subprocess.DEVNULL, timeout=60)
    return path


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("many-models")
    return {"qwen": write_model("qwen2_vl", root / "tiny-qwen"),
            "gemma": write_model("gemma3", root / "tiny-gemma")}


def model_table(name: str, model_dir: Path, engine, aliases=()) -> str:
    return (f'[[models]]\nid = "{name}"\naliases = {list(aliases)!r}\n'
            f'model_path = "{model_dir}"\nworker_urls = ["{engine.url}"]\n\n').replace("'", '"')


def serve_config(procs, config: Path, *flags) -> Gateway:
    """``iris serve --config config`` on a free port, ready."""
    port = free_port()
    args = [binary("iris"), "serve", "--host", "127.0.0.1", "--port", port,
            "--health-check-interval-secs", "0.5", "--config", config, *flags]
    process = procs.spawn("gateway", args)
    gateway = Gateway(process, port, "qwen")

    def ready():
        if process.popen.poll() is not None:
            pytest.fail(f"gateway exited with {process.popen.returncode}:\n{process.log_tail()}")
        return readiness(gateway.base_url) == 200

    wait_until(ready, STARTUP_TIMEOUT, f"gateway readiness on port {port}")
    return gateway


def listed(gateway: Gateway) -> list:
    return [m["id"] for m in gateway.http().get("/v1/models").json()["data"]]


def streamed(client: openai.OpenAI, model: str, text: str) -> tuple:
    """(model answered as, prompt tokens) of a streamed chat."""
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=6,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    names = {c.model for c in chunks}
    assert len(names) == 1, names
    return names.pop(), chunks[-1].usage.prompt_tokens


def test_two_models_one_gateway_and_a_sighup_reload(model_dirs, processes, tmp_path):
    engines = {name: start_engine(processes, path, "aggregated") for name, path in model_dirs.items()}
    config = tmp_path / "iris.toml"
    config.write_text(model_table("qwen", model_dirs["qwen"], engines["qwen"], ["q"])
                      + model_table("gemma", model_dirs["gemma"], engines["gemma"]))
    gateway = serve_config(processes, config)
    client = gateway.client()
    assert listed(gateway) == ["qwen", "q", "gemma"]
    entries = {m["id"]: m for m in gateway.http().get("/v1/models").json()["data"]}
    assert entries["q"]["root"] == "qwen" and entries["gemma"]["max_model_len"] > 0, entries

    # The same message is a different prompt for each model's template.
    text = "Hello there,\n\nfriend"
    counts = {}
    for name in ("qwen", "gemma"):
        tokens = gateway.http().post("/v1/tokenize", json={
            "model": name, "messages": [{"role": "user", "content": text}]}).json()
        counts[name] = tokens["count"]
    assert counts["qwen"] != counts["gemma"], counts

    # Streams to both, interleaved from threads; an alias answers as its model.
    results, errors = [], []

    def run(model):
        try:
            results.append((model, streamed(client, model, text)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((model, e))

    threads = [threading.Thread(target=run, args=(m,)) for m in ["qwen", "gemma", "q", "gemma"] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    expected = {"qwen": ("qwen", counts["qwen"]), "q": ("qwen", counts["qwen"]),
                "gemma": ("gemma", counts["gemma"])}
    assert sorted(results) == sorted((m, expected[m]) for m in ["qwen", "gemma", "q", "gemma"] * 2)
    text_metrics = gateway.metrics()
    assert metric(text_metrics, "iris_requests_total", model="gemma", outcome="ok") == 4
    assert metric(text_metrics, "iris_requests_total", model="qwen", outcome="ok") == 4

    # An unknown model: OpenAI's 404, and Anthropic's on /v1/messages.
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "x"}])
    assert err.value.body["code"] == "model_not_found", err.value.body
    answer = gateway.http().post("/v1/messages", json={
        "model": "llama", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
    assert answer.status_code == 404
    assert answer.json()["error"]["type"] == "not_found_error", answer.text

    # SIGHUP: gemma goes, "again" (the gemma model under a new name) comes.
    config.write_text(model_table("qwen", model_dirs["qwen"], engines["qwen"], ["q"])
                      + model_table("again", model_dirs["gemma"], engines["gemma"]))
    gateway.process.popen.send_signal(signal.SIGHUP)
    wait_until(lambda: listed(gateway) == ["qwen", "q", "again"], 30, "the reloaded models")
    assert streamed(client, "again", text) == ("again", counts["gemma"])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "x"}])

    # A bad file: refused, logged, counted; the models stay.
    config.write_text(config.read_text() + "[[models]]\nid = 3\n")
    gateway.process.popen.send_signal(signal.SIGHUP)
    wait_until(lambda: metric(gateway.metrics(), "iris_config_reloads_total", result="refused") == 1,
               30, "the refused reload")
    assert "configuration reload refused" in gateway.process.log_tail(20000)
    assert listed(gateway) == ["qwen", "q", "again"]
    assert streamed(client, "q", text) == ("qwen", counts["qwen"])
    assert gateway.process.popen.poll() is None


def start_error(config: Path, *flags, env=None) -> str:
    """The stderr of an ``iris serve --config config`` that must not start."""
    done = subprocess.run([str(binary("iris")), "serve", "--port", "0", "--config", str(config),
                           *flags], capture_output=True, text=True, timeout=60,
                          env=clean_env(**(env or {})))
    assert done.returncode == 1, done.stderr
    return done.stderr


def test_a_bad_file_or_a_flag_clash_stops_the_start(model_dirs, tmp_path):
    config = tmp_path / "iris.toml"
    table = f'[[models]]\nid = "m"\nmodel_path = "{model_dirs["qwen"]}"\nworker_urls = ["grpc://127.0.0.1:1"]\n'
    config.write_text(f"request_timeout_secs = 30\n\n{table}policy = \"fastest\"\n")
    stderr = start_error(config)
    assert f"{config}:7: key `models[0].policy`: invalid value 'fastest'" in stderr, stderr
    config.write_text(f"request_timeout_secs = 30\n\n{table}")
    stderr = start_error(config, "--request-timeout-secs", "5")
    assert f"{config}:1: key `request_timeout_secs`: also given as --request-timeout-secs" in stderr, stderr
    stderr = start_error(config, env={"IRIS_REQUEST_TIMEOUT_SECS": "5"})
    assert "also given as --request-timeout-secs (or its IRIS_ variable)" in stderr, stderr
    stderr = start_error(config, "--worker-urls", "grpc://127.0.0.1:2")
    assert "--worker-urls describes a model, but with --config" in stderr, stderr


def adapter_dir(path: Path, tag: str) -> Path:
    """A LoRA adapter directory as the reference engine reads it."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(f'{{"r": 8, "tag": "{tag}"}}')
    return path


def adapter_tables(adapters: dict) -> str:
    return "".join(f'[[models.adapters]]\nname = "{name}"\npath = "{path}"\n\n'
                   for name, path in adapters.items())


class Answers(Load):
    """:class:`Load` that also keeps each plain answer's text."""

    def __init__(self, client, model: str, threads: int = 2):
        super().__init__(client, model, threads)
        self.texts = set()

    def one(self, stream: bool):
        if stream:
            return super().one(stream)
        answer = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=4, extra_body={"ignore_eos": True})
        assert answer.choices[0].finish_reason == "length", answer
        assert answer.model == self.model, answer.model
        self.texts.add(answer.choices[0].message.content)


def test_two_models_and_an_adapter_while_workers_come_and_go(model_dirs, processes, tmp_path):
    """Two models of different vocabularies and templates plus a LoRA
    adapter of one, from one file, under interleaved load (streams too):
    a worker added, one drained (0 failed requests), the file reloaded
    with a second adapter."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(f"{TOKEN}\n")
    sglang = ("--protocol", "sglang", "--metrics-port", "0", *SLOW)
    first, second, extra = (start_engine(processes, model_dirs["qwen"], "aggregated", *sglang)
                            for _ in range(3))
    gemma = start_engine(processes, model_dirs["gemma"], "aggregated")
    adapters = {"sql": adapter_dir(tmp_path / "sql", "sql")}
    config = tmp_path / "iris.toml"

    def write(adapters):
        qwen = (f'[[models]]\nid = "qwen"\nmodel_path = "{model_dirs["qwen"]}"\n'
                f'worker_urls = ["{first.url}?backend=sglang", "{second.url}?backend=sglang"]\n'
                f'max_loras_per_worker = 2\n\n')
        config.write_text(qwen + adapter_tables(adapters) + model_table("gemma", model_dirs["gemma"], gemma))

    write(adapters)
    metrics_port = free_port()
    gateway = serve_config(processes, config, "--metrics-port", str(metrics_port),
                           "--admin-token-file", token_file)
    admin = admin_client(metrics_port)
    assert listed(gateway) == ["qwen", "qwen:sql", "gemma"]
    entry = gateway.http().get("/v1/models").json()["data"][1]
    assert entry["parent"] == "qwen" and entry["root"] == "qwen", entry

    def url_of(engine):
        return next(u for u in listed_workers(admin) if u.startswith(engine.url))

    loads = [Answers(gateway.client(), model) for model in ("qwen", "qwen:sql", "gemma")]
    for load in loads:
        load.__enter__()
    try:
        wait_until(lambda: all(len(load.done) >= 4 for load in loads), 90, "requests to all three")
        added = admin.post("/admin/workers", json={"url": f"{extra.url}?backend=sglang",
                                                   "role": "aggregated", "model": "qwen"})
        assert added.status_code == 201, added.text
        wait_until(lambda: engine_requests(extra) >= 3, 60, "requests on the added worker")
        wait_until(lambda: listed_workers(admin)[url_of(first)]["in_flight"] > 0, 30, "load on the first")
        drained = admin.post(f"/admin/workers/{listed_workers(admin)[url_of(first)]['id']}/drain")
        assert drained.status_code == 202, drained.text
        wait_until(lambda: not any(u.startswith(first.url) for u in listed_workers(admin)), 60,
                   "the drained worker to leave")
        before = [len(load.done) for load in loads]
        wait_until(lambda: all(len(l.done) >= b + 4 for l, b in zip(loads, before)), 90,
                   "requests after the changes")
    finally:
        for load in loads:
            load.__exit__(None, None, None)
    for load in loads:
        assert not load.failures, (load.model, load.failures[:5])
        assert any(load.done) and not all(load.done), f"{load.model}: streams and plain requests"
        assert len(load.texts) == 1, (load.model, load.texts)
    base, sql = loads[0].texts, loads[1].texts
    assert base != sql, "the adapter answers differently from its base model"
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    assert metric(text, "iris_lora_adapter_loads_total", model="qwen") >= 2, "on both workers"

    # Reloaded with a second adapter: listed and served; the first unchanged.
    adapters["chat"] = adapter_dir(tmp_path / "chat", "chat")
    write(adapters)
    gateway.process.popen.send_signal(signal.SIGHUP)
    wait_until(lambda: listed(gateway) == ["qwen", "qwen:sql", "qwen:chat", "gemma"], 30,
               "the reloaded adapters")
    client = gateway.client()
    ask = dict(messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=4,
               extra_body={"ignore_eos": True})
    chat = client.chat.completions.create(model="qwen:chat", **ask).choices[0].message.content
    again = client.chat.completions.create(model="qwen:sql", **ask).choices[0].message.content
    assert chat not in base | sql and {again} == sql, (chat, again)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="qwen:nope", **ask)
    assert err.value.body["code"] == "model_not_found", err.value.body
    admin.close()
