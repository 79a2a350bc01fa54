"""Capacity fallback by resubmission (construct.py); the Lambda handler is resubmit.py."""
