"""Fixtures of the live-server tests: the server's base URL comes from MLASERVE_BASE_URL, which
tests/server/run.sh sets after starting `mlaserve serve` on a free port with a fixture model."""

import os
import re
import time

import httpx
import openai
import pytest


@pytest.fixture(scope="session")
def base_url() -> str:
    url = os.environ.get("MLASERVE_BASE_URL")
    if not url:
        raise RuntimeError("MLASERVE_BASE_URL is not set: run the tests through tests/server/run.sh")
    return url.rstrip("/")


@pytest.fixture(scope="session")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def client(base_url) -> openai.OpenAI:
    # No retries: a 429/503 must surface, not be retried away.
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client(base_url) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def model(client) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample of a Prometheus exposition, e.g. metric(t, "mlaserve:num_requests_running")."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{"):
            continue
        series, value = line.rsplit(" ", 1)
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', series[len(name):]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    raise KeyError(f"no sample {name}{labels} in /metrics")


def wait_until_idle(http, timeout: float = 15.0) -> str:
    """Polls /metrics until no request runs or waits and no cache block is held; returns the text."""
    deadline = time.monotonic() + timeout
    while True:
        text = http.get("/metrics").text
        busy = (
            metric(text, "mlaserve:num_requests_running")
            + metric(text, "mlaserve:num_requests_waiting")
            + metric(text, "mlaserve:cache_blocks_used")
        )
        if busy == 0:
            return text
        if time.monotonic() > deadline:
            raise AssertionError("the engine still holds requests or blocks:\n" + text)
        time.sleep(0.05)
