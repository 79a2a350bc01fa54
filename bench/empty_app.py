"""The baseline for `make bench`: a CDK app with one empty stack, synthesized by the same CLI."""

import aws_cdk as cdk

app = cdk.App()
stack = cdk.Stack(app, "Empty")
cdk.CfnWaitConditionHandle(stack, "Nothing")
app.synth()
