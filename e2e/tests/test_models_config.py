"""Many models behind one ``iris serve --config iris.toml``: two tiny models
of different families (vocabularies and chat templates) on their own
reference engines, driven with the OpenAI SDK (interleaved streams), an
unknown model in both APIs' error shapes, ``/v1/models``, a reload by
``SIGHUP`` that adds and removes a model, a bad file refused at reload and
at start (naming file, line and key), and a flag and the file setting the
same thing refused naming both."""

import signal
import subprocess
import threading
from pathlib import Path

import httpx
import openai
import pytest

from conftest import (STARTUP_TIMEOUT, Gateway, binary, clean_env, free_port, metric,
                      readiness, start_engine, wait_until)


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
