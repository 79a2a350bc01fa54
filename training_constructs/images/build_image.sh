#!/usr/bin/env bash
# The cloud image build (imageBuild=cloud): runs in CodeBuild from container/, inlined into the
# project's buildspec at synth. Builds $DOCKERFILE and pushes it as $REPOSITORY_URI:$IMAGE_TAG with
# zstd layers, unless that tag exists already (tags are immutable; a retried deploy reuses it).
# Input: REPOSITORY_URI, REPOSITORY_NAME, IMAGE_TAG, DOCKERFILE, BUILD_ARGS (NAME=value ..., the
# pins of container/versions.toml), BUILDKIT_IMAGE, AWS_REGION;
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

# The default `docker` driver cannot push zstd layers; a docker-container builder can (Docker docs,
# "Image and registry exporters": compression, force-compression, oci-mediatypes).
# BuildKit comes from ECR Public, pinned by digest (cloud_image_build.py); nothing here pulls from
# Docker Hub. --bootstrap pulls and starts it now, so a failed pull is named here, not mid-build.
if ! docker buildx create --use --bootstrap --driver docker-container --driver-opt image="$BUILDKIT_IMAGE" >/dev/null; then
  echo "could not start BuildKit from $BUILDKIT_IMAGE (ECR Public): check that the image and digest exist"
  exit 1
fi
output="type=image,name=$REPOSITORY_URI:$IMAGE_TAG,push=true"
output+=",oci-mediatypes=true,compression=zstd,force-compression=true"
build_args=()
for pin in ${BUILD_ARGS:-}; do
  build_args+=(--build-arg "$pin")
done
log=$(mktemp)
if docker buildx build --platform linux/amd64 --file "$DOCKERFILE" "${build_args[@]}" --output "$output" . 2>&1 | tee "$log"; then
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
