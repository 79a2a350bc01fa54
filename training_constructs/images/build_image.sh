#!/usr/bin/env bash
# The cloud image build (imageBuild=cloud): runs in CodeBuild from container/, inlined into the
# project's buildspec at synth. Builds $DOCKERFILE and pushes it as $REPOSITORY_URI:$IMAGE_TAG, unless
# that tag exists already (tags are immutable; a retried deploy reuses it).
# Input: REPOSITORY_URI, REPOSITORY_NAME, IMAGE_TAG, DOCKERFILE, BUILD_ARGS (NAME=value ..., the
# pins of container/versions.toml), AWS_REGION;
# NGC_API_KEY and NGC_SECRET when the deploy names an NGC secret.
set -euo pipefail

ngc_help="nvcr.io refused an anonymous pull of the base image: store an NGC API key in Secrets Manager"
ngc_help+=" (aws secretsmanager create-secret --name ngc-api-key --secret-string <key>)"
ngc_help+=" and deploy with -c imageBuild=cloud -c ngcSecret=ngc-api-key"

if aws ecr describe-images --repository-name "$REPOSITORY_NAME" --image-ids imageTag="$IMAGE_TAG" >/dev/null 2>&1; then
  echo "image $REPOSITORY_URI:$IMAGE_TAG exists; nothing to build"
  exit 0
fi

aws ecr get-login-password --region "$AWS_REGION" |
  docker login --username AWS --password-stdin "${REPOSITORY_URI%%/*}"
if [[ -n "${NGC_API_KEY:-}" ]]; then
  printf '%s' "$NGC_API_KEY" | docker login nvcr.io --username "\$oauthtoken" --password-stdin
fi

# CodeBuild's own Docker, in privileged mode, builds: the managed image (aws/codebuild/standard:7.0)
# ships Docker Engine 28.5 and buildx 0.32 (aws/aws-codebuild-docker-images, ubuntu/standard/7.0/
# Dockerfile), so `docker build` is the BuildKit inside dockerd and no builder image is pulled from any
# registry. Its dockerd keeps the classic image store (dockerd-entrypoint.sh: --storage-driver=overlay2),
# whose exporter takes no compression option: the layers are pushed gzip-compressed by dockerd, as a
# local build's are (docs/images.md, "Which Docker builds").
image="$REPOSITORY_URI:$IMAGE_TAG"
build_args=()
for pin in ${BUILD_ARGS:-}; do
  build_args+=(--build-arg "$pin")
done
log=$(mktemp)
if DOCKER_BUILDKIT=1 docker build --platform linux/amd64 --file "$DOCKERFILE" "${build_args[@]}" --tag "$image" . 2>&1 | tee "$log" &&
  docker push "$image" 2>&1 | tee -a "$log"; then
  exit 0
fi
refused='(unauthorized|denied|forbidden|401|403)'
if grep -Eqi "nvcr[.]io.*$refused|$refused.*nvcr[.]io" "$log"; then
  if [[ -n "${NGC_API_KEY:-}" ]]; then
    echo "nvcr.io refused the NGC API key in Secrets Manager secret ${NGC_SECRET:-?}: check or renew the key"
  else
    echo "$ngc_help"
  fi
fi
exit 1
