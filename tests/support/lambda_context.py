"""A Lambda context for calling ``batchrun.aws_lambda.handle`` in-process, and an SQS event
source mapping played by hand (receive, invoke, delete what succeeded)."""

from __future__ import annotations

import time
from typing import Any

from batchrun import aws_lambda


class FakeContext:
    """A LambdaContext whose deadline is real time from now."""

    def __init__(self, seconds: float = 60.0, request_id: str = "req-1") -> None:
        self.deadline = time.monotonic() + seconds
        self.aws_request_id = request_id

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def as_sqs_event(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The event the SQS event source mapping makes of ``receive_message``'s messages."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "eventSource": "aws:sqs",
            }
            for m in messages
        ]
    }


def drain_as_sqs_events(
    sqs: Any, queue_url: str, environ: dict[str, str], seconds: float
) -> list[dict[str, Any]]:
    """Feed the queue to the handler as the event source mapping would, until it is empty."""
    results = []
    for _ in range(200):  # returns once the queue is empty; room for a slow, loaded machine
        got = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        ).get("Messages", [])
        if not got:
            attrs = sqs.get_queue_attributes(
                QueueUrl=queue_url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                ],
            )["Attributes"]
            if not any(int(v) for v in attrs.values()):
                return results
            time.sleep(0.2)
            continue
        event = as_sqs_event(got)
        started = time.monotonic()
        result = aws_lambda.handle(event, FakeContext(seconds), environ=environ)
        assert time.monotonic() - started < seconds, "returned after its deadline"
        results.append(result)
        failed = {f["itemIdentifier"] for f in result["batchItemFailures"]}
        for m in got:
            if m["MessageId"] not in failed:  # what the event source mapping deletes
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
            else:
                sqs.change_message_visibility(
                    QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                )
    raise AssertionError("the queue never drained")
