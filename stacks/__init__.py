"""Deployable units. Each stack composes constructs; stacks are wired by object reference."""
