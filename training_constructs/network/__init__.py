"""The VPC a fleet runs in and the training subnets placed in Availability Zones the user names."""
