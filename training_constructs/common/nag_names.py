"""Resources as cdk-nag names them in its finding ids, for acknowledgements that hold whether or
not a stack is bound to an account and region."""

from __future__ import annotations

import json

from aws_cdk import Stack


def nag_name(stack: Stack, value: str) -> str:
    """A resource as cdk-nag names it in a finding id: literals as they are, references as <Name>,
    imports by their export name. The same ARN reads differently when the stack is bound to an
    account and region (literals) than when it is not (pseudo parameters)."""

    def flat(part: object) -> str:
        if isinstance(part, str):
            return part
        if isinstance(part, dict) and "Ref" in part:
            return f"<{part['Ref']}>"
        if isinstance(part, dict) and "Fn::ImportValue" in part:
            return str(part["Fn::ImportValue"])
        if isinstance(part, dict) and "Fn::Join" in part:
            separator, parts = part["Fn::Join"]
            return separator.join(flat(p) for p in parts)
        if isinstance(part, dict) and len(part) == 1 and next(iter(part)).startswith("Fn::"):
            # Other functions (Fn::Select, Fn::Split, ...) as cdk-nag writes them: compact JSON.
            return json.dumps(part, separators=(",", ":"))
        raise ValueError(f"no cdk-nag name for {part!r}")

    return flat(stack.resolve(value))
