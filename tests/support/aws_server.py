"""moto's server on a free loopback port, for tests that use the real aioboto3 client.

Usage in a test module::

    from support.aws_server import MotoServer

    @pytest.fixture(scope="session")
    def moto_server():
        with MotoServer() as server:
            yield server

    @pytest.fixture
    def aws_env(moto_server):
        moto_server.reset()                  # every test starts with no queues, no identities
        return moto_server.env               # AWS_ENDPOINT_URL, AWS_REGION, dummy keys

The env mapping is meant for ``Settings.from_env(...)``-style injection or a subprocess's
environment; tests never mutate ``os.environ``.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from collections.abc import Callable
from typing import Any, Self

import boto3
from aiobotocore.awsrequest import AioAWSResponse
from moto.server import ThreadedMotoServer

from support.ports import free_port

HOST = "127.0.0.1"
REGION = "us-east-1"


class MotoServer:
    """A ThreadedMotoServer bound to 127.0.0.1 on a free port."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address=HOST, port=self.port, verbose=False)
        self.running = False

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a client needs to reach this server through the standard AWS variables."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }

    def start(self) -> Self:
        self._server.start()
        self.running = True
        return self

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def reset(self) -> None:
        """Forget every resource (moto's reset endpoint)."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def aws_client(server: MotoServer, service: str = "sqs") -> Any:
    """A plain boto3 client on ``server``, for setting up and inspecting what a test uses."""
    return boto3.client(
        service,
        endpoint_url=server.endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def make_queue_with_dlq(
    server: MotoServer,
    name: str = "batchrun-retry",
    *,
    dlq_name: str = "batchrun-dlq",
    max_receives: int = 5,
    visibility_s: int | None = None,
    fifo: bool = False,
) -> tuple[str, str]:
    """A queue whose redrive policy dead-letters after ``max_receives``; (its URL, the DLQ's).
    ``fifo``: both FIFO queues (their names end in ``.fifo``)."""
    sqs = aws_client(server)
    kind = {"FifoQueue": "true"} if fifo else {}
    if fifo:
        name, dlq_name = f"{name}.fifo", f"{dlq_name}.fifo"
    dlq = str(sqs.create_queue(QueueName=dlq_name, Attributes=kind)["QueueUrl"])
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    attributes = {
        **kind,
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": arn, "maxReceiveCount": str(max_receives)}
        ),
    }
    if visibility_s is not None:
        attributes["VisibilityTimeout"] = str(visibility_s)
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    return str(url), dlq


def moto_raw_messages(server: MotoServer) -> list[dict[str, Any]]:
    """What moto holds as sent, through its backend-introspection endpoint."""
    connection = http.client.HTTPConnection(HOST, server.port, timeout=10)
    try:
        connection.request("GET", "/moto-api/data.json")
        data = json.load(connection.getresponse())
    finally:
        connection.close()
    messages: list[dict[str, Any]] = data["ses"]["RawMessage"]
    return messages


class Body:
    """The raw body of a canned HTTP response."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload

    async def read(self) -> bytes:
        return json.dumps(self.payload).encode()


def answer_with(
    status: int,
    code: str | None,
    payload: dict[str, Any],
    *,
    times: int | None = None,
    headers: dict[str, str] | None = None,
) -> Callable[..., AioAWSResponse | None]:
    """A ``before-send`` handler answering with a canned sesv2 (rest-json) response.

    moto never throttles nor suspends an account: the reply is made here and botocore
    parses it exactly as one from SES. ``times`` answers only that many calls.
    """
    calls: list[str] = []

    def handler(request: Any, **_: Any) -> AioAWSResponse | None:
        if times is not None and len(calls) >= times:
            return None
        calls.append(request.url)
        reply_headers = {"Content-Type": "application/json", **(headers or {})}
        if code is not None:
            reply_headers["x-amzn-ErrorType"] = code
        return AioAWSResponse(request.url, status, reply_headers, Body(payload))

    return handler
