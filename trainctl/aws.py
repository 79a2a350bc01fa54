"""The AWS session trainctl talks through, and AWS errors turned into one line with what to do next.

boto3 reads the standard environment itself: AWS_PROFILE, AWS_DEFAULT_REGION, the credential chain,
and AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_<SERVICE> (which the tests point at a server on 127.0.0.1).
botocore reads the region only from AWS_DEFAULT_REGION and the profile, not AWS_REGION, so the region
is taken in the AWS CLI's order: --region, AWS_REGION, AWS_DEFAULT_REGION, the profile's region (AWS
CLI user guide, "Environment variables to configure the AWS CLI", AWS_REGION). Clients are made on
first use, so importing this module calls nothing.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import boto3.exceptions
import botocore.exceptions
import botocore.loaders
import botocore.parsers
import botocore.session

from trainctl.errors import ExitCode, TrainctlError

# Error codes AWS answers with when the credentials exist but are not (or no longer) valid.
_BAD_CREDENTIALS = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "AuthFailure",
    }
)


NO_REGION = "no AWS region: pass --region, set AWS_REGION or AWS_DEFAULT_REGION, or give the profile a region"


@functools.cache
def _shared_loader() -> Any:
    """botocore's service-model loader caches what it reads; one for every session in the process
    spares each command (and each test) re-reading the same JSON models."""
    return botocore.loaders.create_loader()


class Aws:
    """One boto3 session for a command: `--profile` and `--region` win over the environment."""

    def __init__(self, *, region: str | None, profile: str | None) -> None:
        # botocore itself falls back to AWS_DEFAULT_REGION and then the profile's region.
        self._region = region or os.environ.get("AWS_REGION") or None
        self._profile = profile
        self._session: boto3.session.Session | None = None
        self._clients: dict[str, Any] = {}

    @property
    def session(self) -> boto3.session.Session:
        if self._session is None:
            with aws_errors():
                core = botocore.session.Session(profile=self._profile)
                core.register_component("data_loader", _shared_loader())
                self._session = boto3.session.Session(botocore_session=core, region_name=self._region)
        return self._session

    @property
    def profile(self) -> str | None:
        return self._profile

    @property
    def region(self) -> str:
        region = self.session.region_name
        if not region:
            raise TrainctlError(NO_REGION, ExitCode.AWS)
        return str(region)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            region = self.region
            with aws_errors():
                self._clients[service] = self.session.client(service, region_name=region)
        return self._clients[service]


@contextmanager
def aws_errors() -> Iterator[None]:
    """Turn what boto3 raises into a TrainctlError with one line a user can act on."""
    try:
        yield
    except botocore.exceptions.ProfileNotFound as error:
        raise TrainctlError(
            f"profile {error.kwargs.get('profile')!r} is not in the AWS config: pass an existing --profile",
            ExitCode.AWS,
        ) from error
    except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError) as error:
        raise TrainctlError(
            "no AWS credentials: pass --profile, set AWS_PROFILE, or run `aws configure` / `aws sso login`",
            ExitCode.AWS,
        ) from error
    except botocore.exceptions.NoRegionError as error:
        raise TrainctlError(NO_REGION, ExitCode.AWS) from error
    except botocore.exceptions.EndpointConnectionError as error:
        raise TrainctlError(
            f"cannot reach {error.kwargs.get('endpoint_url')}: check the network, --region and AWS_ENDPOINT_URL",
            ExitCode.AWS,
        ) from error
    except botocore.exceptions.ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        message = str(error.response.get("Error", {}).get("Message", "")).splitlines()[0:1]
        text = message[0] if message else code
        if code in _BAD_CREDENTIALS:
            raise TrainctlError(
                f"AWS refused the credentials ({code}): refresh them (`aws sso login`) or pass another --profile",
                ExitCode.AWS,
            ) from error
        raise TrainctlError(f"AWS {error.operation_name} failed: {text}", ExitCode.AWS) from error
    except botocore.parsers.ResponseParserError as error:
        # Not a BotoCoreError: what answered is not AWS (a proxy's page, a mistyped AWS_ENDPOINT_URL).
        raise TrainctlError(not_aws_message(), ExitCode.AWS) from error
    except botocore.exceptions.BotoCoreError as error:
        raise TrainctlError(f"AWS call failed: {_first_line(error)}", ExitCode.AWS) from error
    except boto3.exceptions.Boto3Error as error:
        # boto3's transfers (download_file) wrap what they could not do in their own errors.
        raise TrainctlError(f"AWS transfer failed: {_first_line(error)}", ExitCode.AWS) from error
    except Exception as error:
        # Anything else raised inside the AWS libraries is still AWS that could not be asked, never exit 1:
        # HTML that happens to be well-formed XML makes botocore's parser raise a KeyError.
        where = _raised_in(error)
        if where.split(".")[0] not in _AWS_LIBRARIES:
            raise
        if where.startswith("botocore.parsers"):
            raise TrainctlError(not_aws_message(), ExitCode.AWS) from error
        raise TrainctlError(f"AWS call failed ({type(error).__name__}): {_first_line(error)}", ExitCode.AWS) from error


_AWS_LIBRARIES = frozenset({"botocore", "boto3", "s3transfer", "urllib3"})


def not_aws_message() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the AWS endpoint"
    return (
        f"{endpoint} answered with something that is not an AWS response: check AWS_ENDPOINT_URL, "
        "HTTPS_PROXY and --region"
    )


def _raised_in(error: BaseException) -> str:
    """The module whose code raised `error` (the innermost frame of its traceback)."""
    frame = error.__traceback__
    module = ""
    while frame is not None:
        module = str(frame.tb_frame.f_globals.get("__name__", ""))
        frame = frame.tb_next
    return module


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:160] if lines else type(error).__name__
