"""Lambda code of the cloud image build: report a finished CodeBuild build to CloudFormation."""
