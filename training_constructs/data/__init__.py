"""Where training data lives: the dataset and checkpoint buckets and the bucket of their access logs."""
