#!/usr/bin/env python3
"""Workloads, KV event recorder and report of e2e/bench/cache.sh.

Three subcommands (run with the project's .venv python: httpx and the
published smg-grpc-proto stubs):

``record --engines A,B,… --out FILE``
    Subscribes to every engine's ``SubscribeKvEvents`` (TokenSpeed
    protocol, from sequence 0) and appends one JSON line per event, as
    received: ``[t, worker, "s"|"r"|"c", [block hashes]]`` (t: local Unix
    seconds at receipt; stored, removed, cleared). Prints ``ready`` once
    every stream delivered its first batch (the engine's whole cache);
    SIGTERM flushes and exits.

``run --workload chat|agent|screenshot …``
    Starts a recorder, runs the workload against the gateway (streaming chat
    completions with ``stream_options.include_usage``; sessions arrive as a
    Poisson process, turns follow after exponential think times; every turn
    resends the whole history), stops the recorder, then reads the engines'
    ``--kv-trace`` files and writes one JSON result: per request the client
    view (TTFT, usage), per worker the requests it admitted, the best
    overlap (for each admission, at its time ``t``, the longest leading run
    of its blocks that ANY worker held according to the events, at least
    what the serving worker itself hit) and Iris's predicted/reported
    cached-token counters when its /metrics has them.

``report DIR``
    Markdown tables of every result in DIR, and the targets.

The workloads are deterministic for a given SEED (texts, images, arrival
and think times), so every gateway variant sees the same requests;
assistant turns in the history are the texts the gateway streamed back.
Sizes are in tokens of the tiny model's tokenizer, approximately (the text
is drawn from a word list whose words take ~TOKENS_PER_WORD tokens).

Scale (environment; see cache.sh's header for the defaults' rationale):
  chat:       CHAT_CONVERSATIONS CHAT_TURNS CHAT_SYSTEM_PROMPTS
              CHAT_SYSTEM_TOKENS ("1000-2000": each system prompt's size is
              spread over the range) CHAT_USER_TOKENS ("40-160")
              CHAT_RATE (conversations/s) CHAT_THINK_S (mean think time)
  agent:      AGENT_PROMPTS AGENT_SYSTEM_TOKENS AGENT_SESSIONS
              AGENT_TURNS ("2-3") AGENT_TOOL_TOKENS ("100-400")
              AGENT_RATE (sessions/s) AGENT_THINK_S
  screenshot: SHOT_CONVERSATIONS SHOT_TURNS SHOT_RATE SHOT_THINK_S
              IMAGE (the 1920x1080 JPEG the distinct images derive from)
  all:        MAX_TOKENS SEED REQUEST_TIMEOUT
"""

import argparse
import asyncio
import base64
import glob
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time

# ---------------------------------------------------------------- settings


def env_int(name, default):
    return int(os.environ.get(name) or default)


def env_float(name, default):
    return float(os.environ.get(name) or default)


def env_range(name, default):
    """``"A-B"`` (or ``"A"``) as a (low, high) pair of ints."""
    text = os.environ.get(name) or default
    low, _, high = text.partition("-")
    return int(low), int(high or low)


# Measured on the tiny model's tokenizer (648 ids) with the word list
# below: a word and its space take about this many tokens, and a tool
# definition (JSON-like, punctuation-heavy) about one token per this many
# characters (the report shows the real prompt sizes, from usage).
TOKENS_PER_WORD = 1.7
TOOL_CHARS_PER_TOKEN = 1.7

WORDS = (
    "the of and to in is was it for on are as with his they at be this from have or by one had "
    "not but what all were when we there can an your which their said if do will each about how "
    "up out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use may "
    "water long little very after words called just where most know get through back much before "
    "go good new write our used me man too any day same right look think also around another came "
    "come work three word must because does part even place well such here take why things help "
    "put years different away again off went old number great tell men say small every found still "
    "between name should home big give air line set own under read last never us left end along "
    "while might next sound below saw something thought both few those always looked show large "
    "often together asked house world going want school important until form food keep children "
    "feet land side without boy once animals life enough took sometimes four head above kind began "
    "almost live page got earth need far hand high year mother light parts country father let night "
    "following picture being study second eyes soon times story boys since white days ever paper "
    "hard near sentence better best across during today others however sure means knew try told "
    "young miles sun ways thing whole hear example heard several change answer room sea against top "
    "turned learn point city play toward five using himself usually money seen car morning"
).split()

TOOL_VERBS = "get list search create update delete read write run query fetch send open close move copy".split()
TOOL_NOUNS = "file folder issue ticket user account order invoice page record table job build image report".split()
TYPES = ["string", "integer", "boolean", "number", "array of strings", "object"]


def words(rng, tokens):
    """Text of about `tokens` tokens."""
    n = max(1, round(tokens / TOKENS_PER_WORD))
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tool_prompt(rng, tokens):
    """A tool-heavy agent system prompt of about `tokens` tokens: an
    instruction paragraph, then tool definitions until the size is reached."""
    parts = ["You are an autonomous agent. " + words(rng, 200)]
    size = 210
    i = 0
    while size < tokens:
        name = f"{rng.choice(TOOL_VERBS)}_{rng.choice(TOOL_NOUNS)}_{i}"
        params = ", ".join(
            f'"{rng.choice(WORDS)}_{j}": {{"type": "{rng.choice(TYPES)}", "description": "{words(rng, 12)}"}}'
            for j in range(rng.randint(2, 5))
        )
        tool = f'Tool {name}: {words(rng, 30)} Parameters: {{{params}}}'
        parts.append(tool)
        size += len(tool) / TOOL_CHARS_PER_TOKEN
        i += 1
    return "\n\n".join(parts)


# ---------------------------------------------------------------- images


def perturbed_jpeg(jpeg, index):
    """`jpeg` with its luminance quantisation table changed by `index`
    (+1 on the AC entries 1–24 in zig-zag order whose bit is set): a valid
    JPEG of the same size whose decoded pixels differ from every other
    index's (low-frequency AC coefficients are non-zero in most blocks of
    a photograph), without re-encoding it."""
    if not 0 < index < (1 << 24):
        raise ValueError(f"image index {index} outside 1..2^24")
    out = bytearray(jpeg)
    if out[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no SOI)")
    pos, changed = 2, False
    while pos + 4 <= len(out):
        if out[pos] != 0xFF:
            raise ValueError(f"bad JPEG marker at {pos}")
        marker = out[pos + 1]
        if marker == 0xDA:  # start of scan: the tables are behind us
            break
        length = int.from_bytes(out[pos + 2 : pos + 4], "big")
        if marker == 0xDB:
            p, end = pos + 4, pos + 2 + length
            while p < end:
                precision, table = out[p] >> 4, out[p] & 15
                size = 2 if precision else 1
                entries = p + 1
                if table == 0:
                    for bit in range(24):
                        if index >> bit & 1:
                            at = entries + (1 + bit) * size
                            value = int.from_bytes(out[at : at + size], "big")
                            limit = 65535 if size == 2 else 255
                            value = value + 1 if value < limit else value - 1
                            out[at : at + size] = value.to_bytes(size, "big")
                    changed = True
                p = entries + 64 * size
        pos += 2 + length
    if not changed:
        raise ValueError("no luminance quantisation table found")
    return bytes(out)


def data_url(jpeg):
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


# ---------------------------------------------------------------- workloads


class Session:
    """One conversation: when it starts (seconds after the run's start),
    its system prompt, and per turn the user content and the think time
    before it."""

    def __init__(self, sid, start, system, turns):
        self.sid = sid
        self.start = start
        self.system = system
        self.turns = turns  # [(think_seconds, user_content)]


def poisson_starts(rng, count, rate):
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def build_sessions(kind, seed, n, rate, think, system_of, contents_of):
    """`n` conversations starting as a Poisson process of `rate` per second;
    conversation `i` takes its system prompt from `system_of(rng)` and its
    turns' user contents from `contents_of(rng, i)`, with exponential think
    times of mean `think` between turns. Deterministic per (kind, seed)."""
    starts = poisson_starts(random.Random(f"{kind}-starts-{seed}"), n, rate)
    sessions = []
    for i in range(n):
        r = random.Random(f"{kind}-{seed}-{i}")
        system = system_of(r)
        contents = contents_of(r, i)
        turns = [(0.0 if k == 0 else r.expovariate(1 / think), c) for k, c in enumerate(contents)]
        sessions.append(Session(i, starts[i], system, turns))
    return sessions


def chat_workload(seed):
    n = env_int("CHAT_CONVERSATIONS", 64)
    turns = env_int("CHAT_TURNS", 8)
    prompts = env_int("CHAT_SYSTEM_PROMPTS", 4)
    lo, hi = env_range("CHAT_SYSTEM_TOKENS", "1000-2000")
    ulo, uhi = env_range("CHAT_USER_TOKENS", "40-160")
    rate, think = env_float("CHAT_RATE", 1.0), env_float("CHAT_THINK_S", 3.0)
    rng = random.Random(f"chat-{seed}")
    systems = [
        f"System prompt {i}. " + words(rng, lo + (hi - lo) * i / max(1, prompts - 1))
        for i in range(prompts)
    ]

    def contents(r, c):
        return [f"Turn {k + 1} of chat {c}: " + words(r, r.randint(ulo, uhi)) for k in range(turns)]

    sessions = build_sessions("chat", seed, n, rate, think, lambda r: systems[r.randrange(prompts)], contents)
    info = {
        "conversations": n,
        "turns": turns,
        "system_prompts": prompts,
        "system_tokens": f"{lo}-{hi}",
        "user_tokens": f"{ulo}-{uhi}",
        "rate": rate,
        "think_s": think,
    }
    return sessions, info


def agent_workload(seed):
    prompts = env_int("AGENT_PROMPTS", 8)
    size = env_int("AGENT_SYSTEM_TOKENS", 6000)
    n = env_int("AGENT_SESSIONS", 96)
    tlo, thi = env_range("AGENT_TURNS", "2-3")
    klo, khi = env_range("AGENT_TOOL_TOKENS", "100-400")
    rate, think = env_float("AGENT_RATE", 1.5), env_float("AGENT_THINK_S", 1.0)
    rng = random.Random(f"agent-{seed}")
    systems = [f"Agent {i}. " + tool_prompt(rng, size) for i in range(prompts)]

    def contents(r, s):
        task = f"Task {s}: " + words(r, r.randint(30, 80))
        results = [
            f"Tool result {k} of task {s}: " + words(r, r.randint(klo, khi)) for k in range(1, r.randint(tlo, thi))
        ]
        return [task, *results]

    sessions = build_sessions("agent", seed, n, rate, think, lambda r: systems[r.randrange(prompts)], contents)
    info = {
        "prompts": prompts,
        "system_tokens": size,
        "sessions": n,
        "turns": f"{tlo}-{thi}",
        "tool_tokens": f"{klo}-{khi}",
        "rate": rate,
        "think_s": think,
    }
    return sessions, info


def screenshot_workload(seed):
    n = env_int("SHOT_CONVERSATIONS", 8)
    turns = env_int("SHOT_TURNS", 10)
    rate, think = env_float("SHOT_RATE", 0.5), env_float("SHOT_THINK_S", 2.0)
    image = os.environ.get("IMAGE") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "../../../shared/images/motorcycle_1080p.jpg"
    )
    with open(image, "rb") as f:
        jpeg = f.read()
    system = "You operate a computer from screenshots. " + words(random.Random(f"shot-{seed}"), 60)

    def contents(r, c):
        steps = []
        for k in range(turns):
            # Distinct per (seed, conversation, turn); identical across variants.
            index = 1 + ((seed * 1009 + c) * 64 + k) % ((1 << 24) - 1)
            steps.append(
                [
                    {"type": "text", "text": f"Step {k + 1} of session {c}: " + words(r, r.randint(10, 30))},
                    {"type": "image_url", "image_url": {"url": data_url(perturbed_jpeg(jpeg, index))}},
                ]
            )
        return steps

    sessions = build_sessions("shot", seed, n, rate, think, lambda r: system, contents)
    info = {
        "conversations": n,
        "turns": turns,
        "rate": rate,
        "think_s": think,
        "image": os.path.realpath(image),
    }
    return sessions, info


WORKLOADS = {"chat": chat_workload, "agent": agent_workload, "screenshot": screenshot_workload}

# ---------------------------------------------------------------- client


async def chat(client, url, model, messages, max_tokens, timeout):
    """One streaming chat completion: its timings, usage and text."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    payload = json.dumps(body).encode()  # encoded before the clock starts
    headers = {"content-type": "application/json"}
    rec = {"t_send": time.time(), "ttft": None, "latency": None, "error": None}
    start = time.perf_counter()
    text = []
    usage = None
    try:
        async with client.stream("POST", url, content=payload, headers=headers, timeout=timeout) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode(errors="replace")[:300]
                rec["error"] = f"HTTP {resp.status_code}: {detail}"
                return rec, ""
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        if rec["ttft"] is None:
                            rec["ttft"] = time.perf_counter() - start
                        text.append(piece)
    except Exception as e:  # noqa: BLE001 — any failure is the request's error
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    rec["latency"] = time.perf_counter() - start
    if usage:
        rec["prompt_tokens"] = usage.get("prompt_tokens")
        rec["completion_tokens"] = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        rec["cached_tokens"] = details.get("cached_tokens")
    elif rec["error"] is None:
        rec["error"] = "no usage chunk"
    return rec, "".join(text)


async def run_session(client, url, model, session, t0, max_tokens, timeout, out):
    await asyncio.sleep(max(0.0, t0 + session.start - time.time()))
    messages = [{"role": "system", "content": session.system}]
    for turn, (think, content) in enumerate(session.turns):
        if think:
            await asyncio.sleep(think)
        messages.append({"role": "user", "content": content})
        rec, text = await chat(client, url, model, messages, max_tokens, timeout)
        rec.update(session=session.sid, turn=turn)
        out.append(rec)
        messages.append({"role": "assistant", "content": text or "(no answer)"})


async def run_workload(target, model, sessions, max_tokens, timeout):
    import httpx

    url = target.rstrip("/") + "/v1/chat/completions"
    out = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.time() + 0.5
        await asyncio.gather(
            *(run_session(client, url, model, s, t0, max_tokens, timeout, out) for s in sessions)
        )
    return t0, out


# ---------------------------------------------------------------- recorder


def record(engines, path):
    from smg_grpc_proto.generated import common_pb2, tokenspeed_scheduler_pb2_grpc
    import grpc

    lock = threading.Lock()
    out = open(path, "w", buffering=1 << 20)
    ready = [threading.Event() for _ in engines]
    done = threading.Event()

    def follow(w, address):
        channel = grpc.insecure_channel(address)
        stub = tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerStub(channel)
        request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=0)
        try:
            for batch in stub.SubscribeKvEvents(request):
                t = time.time()
                lines = []
                for event in batch.events:
                    kind = event.WhichOneof("data")
                    if kind == "stored":
                        lines.append([t, w, "s", [b.block_hash for b in event.stored.blocks]])
                    elif kind == "removed":
                        lines.append([t, w, "r", list(event.removed.block_hashes)])
                    elif kind == "cleared":
                        lines.append([t, w, "c", []])
                with lock:
                    for line in lines:
                        out.write(json.dumps(line) + "\n")
                ready[w].set()
        except grpc.RpcError as e:
            if not done.is_set():
                sys.stderr.write(f"recorder: worker {w} ({address}) stream ended: {e.code()} {e.details()}\n")
                with lock:
                    out.write(json.dumps([time.time(), w, "x", []]) + "\n")
        ready[w].set()

    def stop(*_):
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for w, address in enumerate(engines):
        threading.Thread(target=follow, args=(w, address), daemon=True).start()
    for event in ready:
        event.wait(30)
    print("ready", flush=True)
    done.wait()
    with lock:
        out.flush()
        out.close()
    os._exit(0)


# ---------------------------------------------------------------- analysis


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass  # a torn last line
    except OSError:
        pass
    return out


def best_overlap(events, traces, window, block_size):
    """Per traced admission in `window` (t0, t1): its prompt's full blocks,
    its hits and the best overlap any worker offered when it arrived."""
    events = sorted(events, key=lambda e: e[0])
    traces = sorted(traces, key=lambda tr: tr["t"])
    workers = 1 + max([e[1] for e in events] + [tr["worker"] for tr in traces] + [0])
    held = [set() for _ in range(workers)]
    broken = set()
    i = 0
    rows = []
    # Self-check: the serving worker's hits as the events show them
    # should be exactly what the worker itself counted.
    agree = 0
    for tr in traces:
        while i < len(events) and events[i][0] < tr["t"]:
            t, w, kind, hashes = events[i]
            if kind == "s":
                held[w].update(hashes)
            elif kind == "r":
                held[w].difference_update(hashes)
            elif kind == "c":
                held[w].clear()
            elif kind == "x":
                broken.add(w)
            i += 1
        if not window[0] <= tr["t"] <= window[1]:
            continue
        blocks = tr["blocks"]
        best = tr["cached_blocks"]
        for w in range(workers):
            n = 0
            for b in blocks:
                if b not in held[w]:
                    break
                n += 1
            best = max(best, n)
            if w == tr["worker"] and n == tr["cached_blocks"]:
                agree += 1
        rows.append(
            {
                "worker": tr["worker"],
                "request_id": tr["request_id"],
                "blocks": len(blocks),
                "cached_tokens": tr["cached_blocks"] * block_size,
                "best_tokens": best * block_size,
            }
        )
    return rows, sorted(broken), agree


def scrape(url):
    """Every sample at `url` (Prometheus text): {"name{labels}": value}."""
    import httpx

    try:
        text = httpx.get(url, timeout=5).text
    except Exception:  # noqa: BLE001
        return {}
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        try:
            samples[series] = float(value)
        except ValueError:
            pass
    return samples


def family(samples, name):
    """The sum of a family's samples, None when it has none."""
    values = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    return sum(values) if values else None


def delta(after, before, name):
    a = family(after, name)
    return None if a is None else a - (family(before, name) or 0.0)


PREDICTED = "iris_kv_predicted_cached_tokens_total"
REPORTED = "iris_kv_reported_cached_tokens_total"
SMG_BRANCH = "smg_cache_aware_policy_branch_total"
SMG_BATCHES = "smg_kv_event_batches_total"
SMG_OVERLOAD = "smg_worker_overload_fallback_total"


def gateway_counters(before, after):
    """What the gateway's own metrics say about its cache-aware routing:
    Iris's predicted and reported cached tokens; smg's cache_aware
    branches, the KV event batches it applied and the selections its
    worker overload protection overrode (every worker at or above
    --worker-overload-token-usage, 0.8 by default, in the engines'
    EngineLoad.token_usage)."""
    out = {}
    if family(after, PREDICTED) is not None or family(after, REPORTED) is not None:
        out["iris_kv"] = {
            "predicted": delta(after, before, PREDICTED) or 0.0,
            "reported": delta(after, before, REPORTED) or 0.0,
        }
    branches = {}
    for series, value in after.items():
        if series.startswith(SMG_BRANCH + "{"):
            branch = series.split('branch="', 1)[-1].split('"', 1)[0]
            branches[branch] = value - before.get(series, 0.0)
    if branches:
        out["smg_branches"] = branches
    applied = [v for k, v in after.items() if k.startswith(SMG_BATCHES + "{") and 'disposition="applied"' in k]
    if applied:
        out["smg_event_batches_applied"] = sum(applied)
    fallbacks = delta(after, before, SMG_OVERLOAD)
    if fallbacks is not None:
        out["smg_overload_fallbacks"] = fallbacks
    return out


def run(args):
    seed = env_int("SEED", 1)
    max_tokens = env_int("MAX_TOKENS", 8)
    timeout = env_float("REQUEST_TIMEOUT", 120)
    engines = args.engines.split(",")
    traces = args.traces.split(",")
    sessions, info = WORKLOADS[args.workload](seed)
    events_path = args.out[: -len(".json")] + "-events.jsonl" if args.out.endswith(".json") else args.out + ".events"
    recorder = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "record", "--engines", args.engines, "--out", events_path],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = recorder.stdout.readline()
    if line.strip() != "ready":
        recorder.kill()
        sys.exit(f"the KV event recorder did not start ({line!r})")
    metrics_url = args.metrics or None
    before = scrape(metrics_url) if metrics_url else {}
    requests_total = sum(len(s.turns) for s in sessions)
    sys.stderr.write(
        f"{args.workload} on {args.label}: {len(sessions)} sessions, {requests_total} requests …\n"
    )
    wall = time.time()
    t0, recs = asyncio.run(run_workload(args.target, args.model, sessions, max_tokens, timeout))
    t1 = time.time()
    time.sleep(1.0)  # the last events and trace lines
    after = scrape(metrics_url) if metrics_url else {}
    recorder.send_signal(signal.SIGTERM)
    try:
        recorder.wait(10)
    except subprocess.TimeoutExpired:
        recorder.kill()
    events = read_jsonl(events_path)
    all_traces = []
    served = []
    for w, path in enumerate(traces):
        lines = read_jsonl(path)
        for tr in lines:
            tr["worker"] = w
        all_traces.extend(lines)
        served.append(sum(1 for tr in lines if t0 - 0.1 <= tr["t"] <= t1 + 0.5))
    rows, broken, agree = best_overlap(events, all_traces, (t0 - 0.1, t1 + 0.5), args.block_size)
    counters = gateway_counters(before, after)
    result = {
        "workload": args.workload,
        "variant": args.label,
        "params": dict(info, max_tokens=max_tokens, seed=seed, block_size=args.block_size),
        "settings": args.settings,
        "t0": t0,
        "t1": t1,
        "wall_s": t1 - wall,
        "requests": recs,
        "served": served,
        "admissions": rows,
        "broken_streams": broken,
        "events": len(events),
        "events_agree": agree,
        "iris_kv": counters.get("iris_kv"),
        "gateway": counters,
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    s = summary(result)
    sys.stderr.write(
        f"  {s['ok']}/{s['n']} ok in {t1 - t0:.1f}s, cached {pct(s['cached_ratio'])}, "
        f"best {pct(s['best_ratio'])}, TTFT p50 {ms(s['ttft50'])} ms, load max/mean {num(s['imbalance'])}\n"
    )


# ---------------------------------------------------------------- report


def quantile(values, q):
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summary(r):
    recs = r["requests"]
    ok = [x for x in recs if not x["error"]]
    prompt = sum(x.get("prompt_tokens") or 0 for x in ok)
    cached = sum(x.get("cached_tokens") or 0 for x in ok)
    ttfts = [x["ttft"] for x in ok if x["ttft"] is not None]
    span = None
    if ok:
        span = max(x["t_send"] + x["latency"] for x in ok) - min(x["t_send"] for x in ok)
    adm = r["admissions"]
    traced_prompt = sum(a["blocks"] for a in adm) * r["params"]["block_size"]
    traced_cached = sum(a["cached_tokens"] for a in adm)
    best = sum(a["best_tokens"] for a in adm)
    served = r["served"]
    mean = sum(served) / len(served) if served else 0
    iris = r.get("iris_kv")
    return {
        "n": len(recs),
        "ok": len(ok),
        "errors": len(recs) - len(ok),
        "first_error": next((x["error"] for x in recs if x["error"]), None),
        "prompt_tokens": prompt,
        "mean_prompt": prompt / len(ok) if ok else None,
        "cached_tokens": cached,
        "cached_ratio": cached / prompt if prompt else None,
        "traced_cached": traced_cached,
        "best_tokens": best,
        "best_ratio": best / traced_prompt if traced_prompt else None,
        "cached_of_best": traced_cached / best if best else None,
        "ttft50": quantile(ttfts, 0.5),
        "ttft99": quantile(ttfts, 0.99),
        "rps": len(ok) / span if span else None,
        "tps": prompt / span if span else None,
        "served": served,
        "imbalance": max(served) / mean if mean else None,
        "iris_accuracy": (iris["reported"] / iris["predicted"]) if iris and iris["predicted"] else None,
        "iris_kv": iris,
    }


def pct(v):
    return "–" if v is None else f"{100 * v:.1f} %"


def ms(v):
    return "–" if v is None else f"{1000 * v:,.0f}"


def num(v, spec=".2f"):
    return "–" if v is None else format(v, spec)


NAMES = {
    "chat": "(a) multi-turn chat",
    "agent": "(b) agents",
    "screenshot": "(c) screenshot conversations",
}
TTFT_TARGET = {"chat": 0.8, "agent": 0.8, "screenshot": 0.6}


def report(folder):
    results = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(r, dict) or "workload" not in r:
            continue
        results[(r["workload"], r["variant"])] = r
    workloads = [w for w in NAMES if any(k[0] == w for k in results)]
    for w in workloads:
        variants = [k[1] for k in results if k[0] == w]
        any_r = results[(w, variants[0])]
        params = ", ".join(f"{k}={v}" for k, v in any_r["params"].items() if k != "image")
        print(f"\n### {NAMES[w]}\n")
        print(f"{params}; {any_r.get('settings') or ''}\n")
        print(
            "| variant | requests (errors) | prompt tok/req | cached ratio | best overlap | cached % of best "
            "| TTFT p50 ms | TTFT p99 ms | req/s | prompt tok/s | max/mean load (per worker) | Iris predicted→reported |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        sums = {}
        for v in variants:
            s = summary(results[(w, v)])
            sums[v] = s
            iris = s["iris_kv"]
            acc = (
                "n/a"
                if iris is None
                else f"{iris['predicted']:,.0f} → {iris['reported']:,.0f} ({pct(s['iris_accuracy'])})"
            )
            print(
                f"| {v} | {s['ok']} ({s['errors']}) | {num(s['mean_prompt'], ',.0f')} | {pct(s['cached_ratio'])} "
                f"| {pct(s['best_ratio'])} | {pct(s['cached_of_best'])} | {ms(s['ttft50'])} | {ms(s['ttft99'])} "
                f"| {num(s['rps'])} | {num(s['tps'], ',.0f')} | {num(s['imbalance'])} ({'/'.join(map(str, s['served']))}) "
                f"| {acc} |"
            )
        notes = []
        for v in variants:
            r, s = results[(w, v)], sums[v]
            if s["first_error"]:
                notes.append(f"{v}: first error: {s['first_error']}")
            adm = r["admissions"]
            if r.get("events_agree") is not None and r["events_agree"] != len(adm):
                notes.append(
                    f"{v}: the event replay agreed with the serving worker's own hits on "
                    f"{r['events_agree']}/{len(adm)} admissions (the others: events still in flight at the admission)"
                )
            if r.get("broken_streams"):
                notes.append(f"{v}: the KV event stream of worker(s) {r['broken_streams']} broke during the run")
            g = r.get("gateway") or {}
            if "smg_branches" in g or "smg_event_batches_applied" in g:
                branches = ", ".join(f"{k} {n:.0f}" for k, n in sorted(g.get("smg_branches", {}).items()))
                notes.append(
                    f"{v}: smg cache_aware branches: {branches or 'none'}; KV event batches applied: "
                    f"{g.get('smg_event_batches_applied', 0):.0f}; selections overridden by its worker "
                    f"overload protection: {num(g.get('smg_overload_fallbacks'), '.0f')} of {s['n']}"
                )
        if notes:
            print()
            for n in notes:
                print(f"- {n}")
        iris = sums.get("iris-cache_aware")
        smg = sums.get("smg-cache_aware")
        print()
        if iris:
            c = iris["cached_of_best"]
            lb = iris["imbalance"]
            line = (
                f"Targets, iris-cache_aware: cached {pct(c)} of the best overlap (≥ 90 %: "
                f"{'met' if c is not None and c >= 0.9 else 'not met'}), max/mean load {num(lb)} (≤ 1.3: "
                f"{'met' if lb is not None and lb <= 1.3 else 'not met'})"
            )
            if smg and iris["ttft50"] and smg["ttft50"]:
                ratio = iris["ttft50"] / smg["ttft50"]
                goal = TTFT_TARGET[w]
                line += (
                    f", TTFT p50 {ratio:.2f}× smg-cache_aware's (≤ {goal}×: "
                    f"{'met' if ratio <= goal else 'not met'})"
                )
            print(line + ".")
        else:
            print(
                "Targets (iris-cache_aware: cached ≥ 90 % of the best overlap, max/mean load ≤ 1.3, TTFT p50 "
                f"≤ {TTFT_TARGET[w]}× smg-cache_aware's): no iris-cache_aware run."
            )


# ---------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record")
    p.add_argument("--engines", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("run")
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--target", required=True, help="http://HOST:PORT of the gateway")
    p.add_argument("--model", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--engines", required=True, help="the engines' gRPC addresses, comma-separated")
    p.add_argument("--traces", required=True, help="their --kv-trace files, same order")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--metrics", default="", help="the gateway's Prometheus URL (Iris)")
    p.add_argument("--settings", default="", help="a line describing the deployment, for the report")
    p.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("dir")
    args = parser.parse_args()
    if args.command == "record":
        record(args.engines.split(","), args.out)
    elif args.command == "run":
        run(args)
    else:
        report(args.dir)


if __name__ == "__main__":
    main()
