"""The shapes of what a job's secrets name, shared by the app (the `jobSecrets` context key: which secrets
jobs may read) and trainctl (a task's `secrets:`, each a variable name and where its value comes from).

A job's secret is a Batch `secrets` entry, `{name, valueFrom}` (API Secret): the full ARN of a Secrets
Manager secret, optionally followed by `:json-key:version-stage:version-id` with every colon written (Batch
user guide, "Specify sensitive data with Secrets Manager": the parameters are optional, "but if you don't
use them, you must include the colons"), or the full ARN of an SSM parameter. The ECS agent reads them with
the job definition's execution role when a node starts; DescribeJobs shows the ARNs, never the values.
"""

from __future__ import annotations

import re

_PARTITION = r"aws(?:-[a-z]+)*"
_REGION = r"[a-z]{2}(?:-[a-z]+)+-\d"
_ACCOUNT = r"\d{12}"
# Secrets Manager secret names: letters, digits and /_+=.@- (API CreateSecret, Name); the ARN adds a dash
# and six random characters to the name.
_SECRET = rf"arn:{_PARTITION}:secretsmanager:{_REGION}:{_ACCOUNT}:secret:[A-Za-z0-9/_+=.@-]+"
# SSM parameter names: letters, digits and _.-/ (API PutParameter, Name); a name in a path keeps its slashes.
_PARAMETER = rf"arn:{_PARTITION}:ssm:{_REGION}:{_ACCOUNT}:parameter/[A-Za-z0-9_.\-/]+"
# What follows a secret's ARN in valueFrom: json-key, version-stage and version-id, each possibly empty.
_SELECTOR = r"(?::[^:\s]*:[^:\s]*:[^:\s]*)?"

VALUE_FROM = re.compile(rf"^(?:(?P<secret>{_SECRET}){_SELECTOR}|(?P<parameter>{_PARAMETER}))$")
# A `jobSecrets` entry: an ARN as above without the selector, a trailing * allowed (nowhere else).
ALLOWED = re.compile(rf"^(?:{_SECRET}|{_PARAMETER})\*?$|^(?:arn:{_PARTITION}:(?:secretsmanager|ssm):{_REGION}:"
                     rf"{_ACCOUNT}:(?:secret:|parameter/))\*$")  # fmt: skip

# What a refusal says is allowed, short enough for one line ("aws" stands for any partition; "…" for the region
# and account; docs/jobs.md, Secrets, has the rest).
VALUE_FROM_RULE = "arn:aws:secretsmanager:…:secret:NAME[:json-key::] or arn:aws:ssm:…:parameter/NAME"
ALLOWED_RULE = (
    "a comma list of ARNs arn:<partition>:secretsmanager:<region>:<account>:secret:<name> or "
    "arn:<partition>:ssm:<region>:<account>:parameter/<name>, each may end with *"
)

# jobSecrets entries at most: each is about 100 characters of the execution role's inline policy, which IAM
# caps at 10,240 (IAM user guide, IAM and STS quotas: role policy size).
MAX_ALLOWED = 50

# The words of an environment name that mark it as a secret's (docs/jobs.md, Secrets).
SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD")


def resource_of(value_from: str) -> str | None:
    """The ARN an IAM policy names for a valueFrom (its selector left off); None for a malformed one."""
    match = VALUE_FROM.match(value_from)
    if match is None:
        return None
    return match["secret"] or match["parameter"]


def covers(allowed: str, resource: str) -> bool:
    """Whether a `jobSecrets` entry grants this ARN, as IAM matches a trailing * (any characters)."""
    return resource.startswith(allowed[:-1]) if allowed.endswith("*") else resource == allowed


def is_parameter(arn: str) -> bool:
    return ":ssm:" in arn


def secret_word(name: str) -> str | None:
    """The word of an environment variable name that makes it look like a secret's, or None.

    A name is split into words at `_` (and where a lower-case letter meets an upper-case one, for
    `wandbApiKey`); a word that ends with TOKEN, SECRET, KEY, PASSWORD or PASSWD, in any case, marks it:
    HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, GITHUBTOKEN. A word that only contains
    one does not: TOKENIZERS_PARALLELISM (which Hugging Face scripts set), MAX_TOKENS, KEYBOARD, NUM_KEYS.
    """
    for word in re.split(r"_|(?<=[a-z0-9])(?=[A-Z])", name):
        upper = word.upper()
        for marker in SECRET_WORDS:
            if upper.endswith(marker):
                return marker
    return None
