"""The LLM gateway (examples/llm_gateway.py) under Locust: streaming clients asking a few
prompts over and over, each prompt going cold every ``--ttl`` seconds.

    python loadtest/locust_gateway.py            # 64 users, 4 gateway workers, 40 s, TTL 3 s
    python loadtest/locust_gateway.py --quick    # 16 users, 2 workers, 10 s (CI)

It starts a throwaway Redis server, the fake model (its tokens ``MODEL_TOKENS`` x
``MODEL_TOKEN_PAUSE`` apart) and the gateway under uvicorn on free 127.0.0.1 ports, then
runs this file's ``PromptUser`` headless: each user posts a streaming completion of one
of ``--prompts`` prompts (Zipf-like: the first asked most) and reads its events to the
end, noting its first token as a request of its own (``first token``).

The model logs each call (its prompt, when it began and ended). A prompt's window opens
with a model call and lasts until the completion it made could first expire (its end
plus ttl x (1 - jitter)): another model call of the prompt inside it is a second
upstream call for one cold prompt (``expiry_windows``). It prints the requests, the
time to first token beside the whole completion's time, and the model calls per window,
and exits non-zero if a window had more than one, or Locust failed. Its last line is the
figures as JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

try:  # what Locust loads: the users
    from locust import HttpUser, between, task

    PROMPTS = [f"prompt number {index} about caches" for index in range(int(os.environ.get("GATEWAY_PROMPTS", "8")))]
    WEIGHTS = [1 / (rank + 1) for rank in range(len(PROMPTS))]

    class PromptUser(HttpUser):
        wait_time = between(0.05, 0.3)

        @task
        def complete(self) -> None:
            prompt = random.choices(PROMPTS, WEIGHTS)[0]
            body = {"model": "fake-1", "stream": True, "temperature": 0,
                    "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
            began = time.perf_counter()
            first = None
            with self.client.post("/v1/chat/completions", json=body, stream=True, catch_response=True,
                                  name="completion") as answer:  # fmt: skip
                tokens = 0
                for line in answer.iter_lines():
                    if line.startswith(b"data: {"):
                        tokens += 1
                        if first is None:
                            first = time.perf_counter() - began
                if answer.status_code != 200 or tokens == 0:
                    answer.failure(f"status {answer.status_code}, {tokens} tokens")
                    return
            self.environment.events.request.fire(
                request_type="SSE", name="first token", response_time=(first or 0) * 1000, response_length=0,
                exception=None, context={},
            )  # fmt: skip

except ImportError:  # the orchestrator runs without Locust imported in it
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4, help="the gateway's uvicorn workers")
    parser.add_argument("--seconds", type=int, default=40)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    if options.quick:
        options.users, options.workers, options.seconds = 16, 2, 10
    sys.path.insert(0, str(ROOT / "examples"))
    import httpx  # noqa: F401  (the gateway's client: present, or fail here)
    import redis
    from expiry_windows import expiry_windows, summarize
    from llm_gateway import TOKEN_PAUSE, TOKENS, running

    from stampede.testing import RedisServer, find_server_binary, free_port

    os.environ["GATEWAY_TTL"] = str(options.ttl)
    os.environ["GATEWAY_PROMPTS"] = str(options.prompts)
    with (
        RedisServer(find_server_binary()) as server,
        tempfile.TemporaryDirectory() as out,
        running(server.url, options.workers) as base,
    ):
        command = [sys.executable, "-m", "locust", "-f", __file__, "--headless", "--host", base,
                   "-u", str(options.users), "-r", str(options.users), "-t", f"{options.seconds}s",
                   "--csv", f"{out}/gateway", "--only-summary", "--master-bind-port", str(free_port())]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=options.seconds + 120)
        log = [json.loads(line) for line in redis.Redis.from_url(server.url).lrange("model:log", 0, -1)]
        with open(f"{out}/gateway_stats.csv") as table:
            stats = {row["Name"]: row for row in csv.DictReader(table)}

    class Call:
        def __init__(self, entry: dict[str, Any]) -> None:
            self.what, self.started, self.finished = entry["what"], entry["started"], entry["finished"]

    windows = summarize(expiry_windows([Call(entry) for entry in log], options.ttl * 0.9))
    completion, first = stats.get("completion", {}), stats.get("first token", {})
    figures = {
        "users": options.users,
        "gateway workers": options.workers,
        "seconds": options.seconds,
        "ttl": options.ttl,
        "requests": int(completion.get("Request Count", 0)),
        "failures": int(completion.get("Failure Count", 0)),
        "first token p50 ms": float(first.get("50%", 0) or 0),
        "first token p99 ms": float(first.get("99%", 0) or 0),
        "whole completion ms": TOKENS * TOKEN_PAUSE * 1000,
        "model calls": windows["queries"],
        "windows": windows["windows"],
        "max model calls per window": windows["max_queries_per_window"],
    }
    print(f"{options.users} streaming users, {options.workers} gateway workers, {options.seconds} s, "
          f"{options.prompts} prompts, ttl {options.ttl:g} s:")  # fmt: skip
    print(f"  requests {figures['requests']}, failures {figures['failures']}; first token p50 "
          f"{figures['first token p50 ms']:.0f} ms, p99 {figures['first token p99 ms']:.0f} ms "
          f"(a whole completion takes {figures['whole completion ms']:.0f} ms)")  # fmt: skip
    print(f"  model calls {figures['model calls']} in {figures['windows']} prompt windows: "
          f"at most {figures['max model calls per window']} per window")  # fmt: skip
    print(json.dumps(figures))
    failed = done.returncode != 0 or figures["max model calls per window"] != 1 or figures["failures"] > 0
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
