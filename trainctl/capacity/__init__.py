"""EC2 Capacity Blocks for ML: finding offerings, listing the account's blocks, the rules EC2 applies."""
