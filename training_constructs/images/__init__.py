"""The training images: built by CDK from container/ at deploy time, or in CodeBuild (`-c imageBuild=cloud`)."""
