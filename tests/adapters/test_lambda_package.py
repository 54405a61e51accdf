"""The Lambda deployment: the SAM template, the zip, and what importing the handler costs.

- ``deploy/template.yaml`` passes cfn-lint, which runs the SAM transform offline
  (aws-sam-translator) and validates the CloudFormation it generates, and keeps the
  contract cfn-lint cannot know (timeouts, redrive, least privilege).
- A zip built for this interpreter, unzipped into an empty folder, runs the handler in a
  process that sees nothing else (``-S``: no site-packages), so a dependency missing from
  the zip fails here and not in AWS.
- Importing ``batchrun.aws_lambda`` imports no backend: an SES deployment's cold start
  never pays for aiomysql or aiosmtplib, and a dry run never loads botocore.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import decode
from support import ROOT
from support.aws_server import REGION, MotoServer, aws_client, make_queue_with_dlq

TEMPLATE = ROOT / "deploy" / "template.yaml"
BUILD = ROOT / "deploy" / "build_lambda.py"
EVENTS = ROOT / "tests" / "support" / "events"
FUNCTION_TIMEOUT = 900
SENDER = "birthday@example.com"
# Backends and their SDKs: each is imported only when a URL scheme asks for it.
HEAVY = (
    "aiosmtplib",
    "aiomysql",
    "pymysql",
    "asyncpg",
    "aioboto3",
    "aiobotocore",
    "botocore",
    "boto3",
)
# Actions that may name Resource "*": they have no resource-level permissions.
STAR_ACTIONS = {
    "ses:GetAccount",
    "ses:GetSendQuota",
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
}
# The Lambda zip's bound (deploy/README.md), and what it must not carry.
MAX_ZIP_BYTES = 15_000_000
NOT_IN_ZIP = ("typer", "rich", "click", "pydantic", "pydantic_core", "pygments", "s3transfer")
CFN_LINT = "import sys; from cfnlint.runner import main; sys.exit(main())"

# Run inside the unzipped package: invoke the handler, then import every backend, and
# report where each loaded module came from.
INVOKE = r"""
import importlib, json, sys

class Context:
    aws_request_id = "zip-test"

    def get_remaining_time_in_millis(self):
        return 300_000

from batchrun.aws_lambda import handler

result = handler(json.loads(sys.argv[1]), Context())
for name in ("batchrun.mail.ses", "batchrun.mail.smtp", "batchrun.queue.sqs", "batchrun.db.mysql",
             "batchrun.db.postgresql"):
    importlib.import_module(name)
files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
print("RESULT " + json.dumps({"result": result, "files": [f for f in files if f]}))
"""


# -- the template -------------------------------------------------------------------------


def cfn_lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            *("-c", CFN_LINT, "--format", "parseable", "--include-checks", "I"),
            *("--regions", "us-east-1", "eu-west-1", "ap-southeast-2"),
            *("--", str(path)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=path.parent,
    )


def test_template_passes_cfn_lint() -> None:
    result = cfn_lint(TEMPLATE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cfn_lint_validates_what_the_sam_transform_generates(tmp_path: Path) -> None:
    """A typo inside an SQS event only shows once SAM turns it into an EventSourceMapping."""
    broken = tmp_path / "template.yaml"
    broken.write_text(
        TEMPLATE.read_text().replace("[ReportBatchItemFailures]", "[ReportBatchItemFailure]")
    )
    result = cfn_lint(broken)
    assert result.returncode != 0 and "ReportBatchItemFailure'" in result.stdout, (
        "cfn-lint no longer runs the SAM transform (1.54+ validates SAM resources by schema "
        "only, without aws-sam-translator); keep cfn-lint<1.54 in the dev extra\n"
        + result.stdout
        + result.stderr
    )


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    parsed, problems = decode(str(TEMPLATE))
    assert not problems, problems
    assert parsed is not None
    return dict(parsed)


def functions(template: Mapping[str, Any]) -> dict[str, Any]:
    found = {
        name: resource["Properties"]
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Serverless::Function"
    }
    assert found
    return found


def test_function_queue_and_schedule_keep_the_lambda_contract(template: dict[str, Any]) -> None:
    common = template["Globals"]["Function"]
    assert common["Timeout"] == FUNCTION_TIMEOUT
    assert common["Runtime"] == "python3.12"
    assert common["Handler"] == "batchrun.aws_lambda.handler"
    queue = template["Resources"]["RetryQueue"]["Properties"]
    assert queue["VisibilityTimeout"] >= 6 * FUNCTION_TIMEOUT
    assert queue["RedrivePolicy"] == {
        "deadLetterTargetArn": {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]},
        "maxReceiveCount": {"Ref": "MaxReceiveCount"},
    }
    assert template["Parameters"]["MaximumConcurrency"]["MinValue"] == 2
    arches = set()
    for props in functions(template).values():
        arches.update(props["Architectures"])
        assert props["Role"] == {"Fn::GetAtt": ["FunctionRole", "Arn"]}  # SAM adds nothing
        assert "Policies" not in props
        events = {name: event["Properties"] for name, event in props["Events"].items()}
        kinds = {name: event["Type"] for name, event in props["Events"].items()}
        assert kinds == {"Monthly": "Schedule", "Retries": "SQS", "MailEvents": "SQS"}
        assert events["Monthly"]["Schedule"] == {"Ref": "ScheduleExpression"}
        sqs = events["Retries"]
        assert sqs["Queue"] == {"Fn::GetAtt": ["RetryQueue", "Arn"]}
        assert sqs["ScalingConfig"] == {"MaximumConcurrency": {"Ref": "MaximumConcurrency"}}
        assert events["MailEvents"]["Queue"] == {"Fn::GetAtt": ["EventsQueue", "Arn"]}
        for sqs in (events["Retries"], events["MailEvents"]):
            assert sqs["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
            assert sqs.get("MaximumBatchingWindowInSeconds", 0) == 0  # else add it to the 6x
        # One-click unsubscribe: a POST from a mailbox provider carries no credentials.
        assert props["FunctionUrlConfig"] == {"AuthType": "NONE"}
    assert arches == {"x86_64", "arm64"}


def test_ses_events_reach_the_events_queue_and_nothing_else_writes_it(
    template: dict[str, Any],
) -> None:
    resources = template["Resources"]
    events = resources["EventsQueue"]["Properties"]
    assert events["VisibilityTimeout"] >= 6 * FUNCTION_TIMEOUT
    assert events["RedrivePolicy"]["deadLetterTargetArn"] == {
        "Fn::GetAtt": ["EventsDeadLetterQueue", "Arn"]
    }
    destination = resources["SesEventDestination"]["Properties"]
    assert destination["ConfigurationSetName"] == {"Ref": "SesConfigurationSet"}
    assert set(destination["EventDestination"]["MatchingEventTypes"]) == {"bounce", "complaint"}
    assert destination["EventDestination"]["SnsDestination"] == {
        "TopicARN": {"Ref": "SesEventsTopic"}
    }
    subscription = resources["EventsSubscription"]["Properties"]
    assert subscription["Protocol"] == "sqs"
    assert subscription["Endpoint"] == {"Fn::GetAtt": ["EventsQueue", "Arn"]}
    (allowed,) = resources["EventsQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert allowed["Principal"] == {"Service": "sns.amazonaws.com"}
    assert allowed["Action"] == "sqs:SendMessage"
    assert allowed["Condition"] == {"ArnEquals": {"aws:SourceArn": {"Ref": "SesEventsTopic"}}}
    (publish,) = resources["SesEventsTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert publish["Principal"] == {"Service": "ses.amazonaws.com"}
    assert publish["Action"] == "sns:Publish"
    assert "AWS:SourceAccount" in publish["Condition"]["StringEquals"]
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert env["BATCHRUN_SES_CONFIGURATION_SET"] == {"Ref": "SesConfigurationSet"}
    # Lambda's records name their queue by ARN; the topic's Ref is its ARN.
    assert env["BATCHRUN_EVENTS_QUEUE"] == {"Fn::GetAtt": ["EventsQueue", "Arn"]}
    assert env["BATCHRUN_EVENTS_TOPIC"] == {"Ref": "SesEventsTopic"}
    assert template["Parameters"]["UnsubscribeSecret"]["NoEcho"] is True


def test_environment_names_the_secret_not_the_url(template: dict[str, Any]) -> None:
    env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert env["BATCHRUN_DB_SECRET_ARN"] == {"Ref": "DbSecretArn"}
    assert env["BATCHRUN_RETRY_QUEUE"] == {"Ref": "RetryQueue"}  # Ref of a queue: its URL
    assert {
        "BATCHRUN_MAIL",
        "BATCHRUN_FROM",
        "BATCHRUN_CONCURRENCY",
        "BATCHRUN_RATE",
        "BATCHRUN_MAX_RECEIVES",
    } <= set(env)
    assert "BATCHRUN_DB" not in env
    assert "Default" not in template["Parameters"]["DbSecretArn"]


def test_role_grants_only_what_the_function_uses(template: dict[str, Any]) -> None:
    role = template["Resources"]["FunctionRole"]["Properties"]
    assert "ManagedPolicyArns" not in role
    statements: list[dict[str, Any]] = []
    for policy in role["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            if "Fn::If" in statement:  # [condition, statement, AWS::NoValue]
                statement = statement["Fn::If"][1]
            statements.append(statement)
    by_sid = {s["Sid"]: s for s in statements}
    for statement in statements:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"]
        actions = [actions] if isinstance(actions, str) else actions
        assert all(":" in a and not a.endswith("*") for a in actions), actions
        if statement["Resource"] == "*":
            assert set(actions) <= STAR_ACTIONS, statement["Sid"]
    queues = [{"Fn::GetAtt": ["RetryQueue", "Arn"]}, {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}]
    assert by_sid["RetryQueues"]["Resource"] == queues
    assert all(a.startswith("sqs:") for a in by_sid["RetryQueues"]["Action"])
    assert by_sid["DatabaseUrl"]["Resource"] == {"Ref": "DbSecretArn"}
    send = by_sid["SendAsTheSenderOnly"]
    assert set(send["Action"]) == {"ses:SendEmail", "ses:SendRawEmail"}
    assert send["Condition"] == {"StringEquals": {"ses:FromAddress": {"Ref": "SenderAddress"}}}
    identities, sets = send["Resource"][:2], send["Resource"][2:]
    assert all(":identity/" in json.dumps(r) for r in identities)
    # the configuration set every message names, and only it
    assert [json.dumps(r) for r in sets] == [
        json.dumps(
            {
                "Fn::Sub": "arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:"
                "configuration-set/${SesConfigurationSet}"
            }
        )
    ]
    # The events queue: polled and deleted from, never sent to, nor its DLQ touched.
    assert by_sid["EventsQueue"]["Resource"] == {"Fn::GetAtt": ["EventsQueue", "Arn"]}
    assert set(by_sid["EventsQueue"]["Action"]) == {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
    }
    granted = json.dumps(statements)
    assert "EventsDeadLetterQueue" not in granted and "sns:" not in granted


# -- cold start ---------------------------------------------------------------------------


def test_importing_the_handler_imports_no_backend(tmp_path: Path) -> None:
    code = (
        "import json, sys, batchrun.aws_lambda; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "batchrun" in loaded
    assert not loaded & set(HEAVY), f"imported at cold start: {sorted(loaded & set(HEAVY))}"


# -- the zip ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lambda_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zip built for this interpreter."""
    out = tmp_path_factory.mktemp("zip") / "batchrun-lambda.zip"
    build = subprocess.run(
        [sys.executable, str(BUILD), "--arch", "local", "--out", str(out), "-q"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


@pytest.fixture(scope="module")
def lambda_root(lambda_zip: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip unzipped into an empty folder (like /var/task)."""
    root = tmp_path_factory.mktemp("task")
    assert not any(root.iterdir())
    with zipfile.ZipFile(lambda_zip) as archive:
        names = archive.namelist()
        assert "batchrun/aws_lambda.py" in names
        assert any(n.startswith("batchrun/sql/") and n.endswith(".sql") for n in names)
        assert not any(n.startswith("bin/") or n.endswith("direct_url.json") for n in names)
        archive.extractall(root)
    return root


def test_zip_is_at_most_15_mb_and_leaves_the_cli_out(lambda_zip: Path) -> None:
    """What the handler never imports stays out: typer, rich, pydantic, unused AWS models."""
    assert lambda_zip.stat().st_size <= MAX_ZIP_BYTES, f"{lambda_zip.stat().st_size:,} bytes"
    with zipfile.ZipFile(lambda_zip) as archive:
        names = archive.namelist()
    tops = {name.split("/", 1)[0] for name in names}
    dists = {top.rsplit("-", 1)[0].lower() for top in tops if top.endswith(".dist-info")}
    assert not dists & set(NOT_IN_ZIP), sorted(dists & set(NOT_IN_ZIP))
    assert not tops & {*NOT_IN_ZIP, "docs", "examples"}, sorted(tops)
    assert {"aioboto3", "aiobotocore", "botocore", "aiohttp", "aiomysql", "jinja2"} <= tops
    services = {
        n.split("/")[2] for n in names if n.startswith("botocore/data/") and n.count("/") > 3
    }
    assert services == {"ses", "sesv2", "sqs", "secretsmanager", "sts"}


def test_handler_imports_from_the_unpacked_zip_alone(lambda_root: Path) -> None:
    """No site-packages: the handler, every backend and its SDK import from the zip."""
    code = (
        "import importlib, json, sys, batchrun.aws_lambda\n"
        "for name in ('batchrun.mail.ses', 'batchrun.mail.smtp', 'batchrun.queue.sqs',\n"
        "             'batchrun.db.mysql', 'batchrun.db.sqlite', 'batchrun.aws_secrets'):\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps([getattr(m, '__file__', None) or '' for m in sys.modules.values()]))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-s", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=lambda_root,
        env={"PYTHONPATH": str(lambda_root), "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"},
    )
    assert done.returncode == 0, done.stderr
    files = [f for f in json.loads(done.stdout) if f]
    stdlib = os.path.dirname(os.__file__)
    outside = [f for f in files if not f.startswith((str(lambda_root), stdlib))]
    assert not outside, outside[:5]
    assert any(f.startswith(str(lambda_root / "botocore")) for f in files)


def prepare_db(tmp_path: Path, users: int = 500) -> str:
    """A migrated, seeded SQLite file, made with this checkout's CLI."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    env = {**os.environ, "BATCHRUN_DB": url}
    for args in (["db", "migrate"], ["db", "seed", "--users", str(users)]):
        done = subprocess.run(
            [sys.executable, "-m", "batchrun", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return url


def dry_run_eligible(url: str, month: str) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "batchrun", "birthday", "--month", month, "--dry-run", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "BATCHRUN_DB": url},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return int(json.loads(done.stdout)["eligible"])


def invoke_from(root: Path, event: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The handler in a clean process that sees only ``root`` and the standard library."""
    done = subprocess.run(
        [sys.executable, "-S", "-s", "-c", INVOKE, json.dumps(event)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=root,
        env={
            "PYTHONPATH": str(root),
            "PYTHONDONTWRITEBYTECODE": "1",  # /var/task is read-only
            "LAMBDA_TASK_ROOT": str(root),
            "LANG": "C.UTF-8",
            "TZ": "UTC",
            **env,
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    (report,) = (line for line in lines if line.startswith("RESULT "))
    for line in lines:
        if line != report:
            json.loads(line)  # the function's log: JSON lines only
    payload: dict[str, Any] = json.loads(report.removeprefix("RESULT "))
    stray = [f for f in payload["files"] if "site-packages" in f or "dist-packages" in f]
    assert not stray, f"modules loaded from outside the zip: {stray[:5]}"
    batchrun_files = [f for f in payload["files"] if "/batchrun/" in f]
    assert batchrun_files and all(f.startswith(str(root)) for f in batchrun_files)
    result: dict[str, Any] = payload["result"]
    return result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_zip_alone_runs_an_on_demand_dry_run(lambda_root: Path, tmp_path: Path) -> None:
    url = prepare_db(tmp_path)
    event = json.loads((EVENTS / "on_demand_dry_run.json").read_text())
    result = invoke_from(lambda_root, event, {"BATCHRUN_DB": url})
    assert result["dry_run"] is True
    assert result["eligible"] > 0
    assert result["eligible"] == dry_run_eligible(url, event["month"])
    assert result["cards_created"] == result["emails_sent"] == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_zip_alone_sends_through_ses_with_an_sqs_retry_queue(
    lambda_root: Path, tmp_path: Path, moto_server: MotoServer
) -> None:
    """The scheduled run, not a dry run: aioboto3, botocore and aiohttp from the zip."""
    moto_server.reset()
    sqs = aws_client(moto_server, "sqs")
    queue_url, dlq = make_queue_with_dlq(moto_server)
    ses = aws_client(moto_server, "ses")
    ses.verify_email_identity(EmailAddress=SENDER)
    url = prepare_db(tmp_path)
    eligible = dry_run_eligible(url, "2025-06")
    event = json.loads((EVENTS / "schedule.json").read_text())
    result = invoke_from(
        lambda_root,
        event,
        {
            **moto_server.env,
            "BATCHRUN_DB": url,  # the handler's own (the template passes a secret's ARN)
            "BATCHRUN_MAIL": f"ses://{REGION}",
            "BATCHRUN_FROM": SENDER,
            "BATCHRUN_RETRY_QUEUE": queue_url,
        },
    )
    assert result["month"] == "2025-06"
    assert result["dry_run"] is False
    assert result["eligible"] == eligible > 0
    sendable = eligible - result["skipped"]  # invalid addresses: no card, no mail
    assert result["cards_created"] == result["emails_sent"] == sendable > 0
    assert result["failed"] == result["queued_for_retry"] == 0
    # moto counts a raw message once per Destination and once per To header: not a count.
    assert ses.get_send_quota()["SentLast24Hours"] > 0
    for url in (queue_url, dlq):
        depth = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert depth["ApproximateNumberOfMessages"] == "0"
        assert depth["ApproximateNumberOfMessagesNotVisible"] == "0"
