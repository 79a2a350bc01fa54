"""Small helpers the constructs share: files packed into user data, cdk-nag names, log retention."""
