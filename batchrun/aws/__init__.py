"""The AWS Lambda handler's parts (the entry point is ``batchrun.aws_lambda.handler``).

invocation.py   what every invocation shares: its runtime, its log line and metrics
sqs_event.py    an SQS event: work records on the road; SES events from the events queue
http_event.py   an HTTP event: one-click unsubscribe over a Function URL
"""
