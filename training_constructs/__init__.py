"""L3 building blocks of the training platform.

Named `training_constructs`, not `constructs`: a top-level package called `constructs` would
shadow the `constructs` library that aws-cdk-lib imports.
"""
