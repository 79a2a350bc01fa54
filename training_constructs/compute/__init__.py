"""A fleet's Batch compute: the compute environment, its placement group and the EFA launch template."""
