"""trainctl: run, watch and account for training jobs on the fleets `cdk deploy --all` built.

Everything it needs comes from the stacks' CloudFormation outputs; there is no configuration file.
Importing the package makes no AWS call.
"""

__version__ = "0.1.0"
