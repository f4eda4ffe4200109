#!/usr/bin/env bash
# Checks the chart: helm lint --strict and helm template with the default and the non-default
# values, a schema violation that must be refused, and the PrometheusRule's alerts through
# `promtool check rules` and `promtool test rules` (e2e/chart/alerts-test.yaml).
# Usage: check.sh HELM PROMTOOL
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
chart="$here/../../charts/podha"
helm=${1:?usage: check.sh HELM PROMTOOL}
promtool=${2:?usage: check.sh HELM PROMTOOL}
# helm template assumes an old Kubernetes unless told; render for the version podha is tested on.
kube=$(sed -n "s/^K8S_VERSION := //p" "$here/../versions.mk")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$helm" lint --strict "$chart"
"$helm" lint --strict "$chart" -f "$here/values-full.yaml"
"$helm" template podha "$chart" --kube-version "$kube" > "$work/default.yaml"
"$helm" template podha "$chart" --kube-version "$kube" -f "$here/values-full.yaml" > "$work/full.yaml"
for kind in PrometheusRule ConfigMap ServiceMonitor PodMonitor PodHAPolicy ResourceQuota; do
  grep -q "^kind: $kind$" "$work/full.yaml" || { echo "check.sh: non-default values render no $kind" >&2; exit 1; }
  if [ "$kind" != PodHAPolicy ] && grep -q "^kind: $kind$" "$work/default.yaml"; then
    echo "check.sh: default values render a $kind, which must be off by default" >&2; exit 1
  fi
done
# The agents' PodMonitor comes with the operator's, on their port (they have no Service), unless
# podMonitor.agents or the agent is off.
[ "$(grep -c "^kind: PodMonitor$" "$work/full.yaml")" = 2 ] && grep -q -- "- port: heartbeat$" "$work/full.yaml" \
  || { echo "check.sh: podMonitor.enabled does not scrape the agents on their port" >&2; exit 1; }
for off in podMonitor.agents=false agent.enabled=false; do
  [ "$("$helm" template podha "$chart" --kube-version "$kube" -f "$here/values-full.yaml" --set "$off" \
       | grep -c "^kind: PodMonitor$")" = 1 ] \
    || { echo "check.sh: $off still renders the agents' PodMonitor" >&2; exit 1; }
done
# The agent is on by default (the policies' default proof is the agent's), with the node's
# watchdog as the privileged container sees it: no hostPath for the device, which would keep
# the pod off a node without one (CharDevice) or create a directory in its place.
grep -q "^kind: DaemonSet$" "$work/default.yaml" && grep -q -- "--watchdog=/dev/watchdog" "$work/default.yaml" \
  || { echo "check.sh: default values install no agent with the node's watchdog" >&2; exit 1; }
if grep -q "name: watchdog$" "$work/default.yaml"; then
  echo "check.sh: default values mount the watchdog from the host" >&2; exit 1
fi
# Not on control-plane nodes unless asked (agent.controlPlane).
grep -q "key: node-role.kubernetes.io/control-plane" "$work/default.yaml" \
  || { echo "check.sh: default values run the agent on control-plane nodes" >&2; exit 1; }
if "$helm" template podha "$chart" --kube-version "$kube" --set agent.controlPlane=true \
  | grep -q "key: node-role.kubernetes.io/control-plane"; then
  echo "check.sh: agent.controlPlane=true still keeps the agent off control-plane nodes" >&2; exit 1
fi
if "$helm" template podha "$chart" --kube-version "$kube" --set agent.enabled=false | grep -q "^kind: DaemonSet$"; then
  echo "check.sh: agent.enabled=false still renders the agent" >&2; exit 1
fi

# podha and its agent run in the critical priority classes by default; the quota some clusters
# (GKE) want for them outside kube-system covers exactly the critical classes in use, and is
# refused when none is.
grep -q "priorityClassName: system-cluster-critical$" "$work/default.yaml" \
  && grep -q "priorityClassName: system-node-critical$" "$work/default.yaml" \
  || { echo "check.sh: default values do not run podha and its agent in the critical classes" >&2; exit 1; }
"$helm" template podha "$chart" --kube-version "$kube" --set criticalPodsQuota.create=true \
  --show-only templates/critical-pods-quota.yaml > "$work/quota.yaml"
for want in "scopeName: PriorityClass" "- system-cluster-critical$" "- system-node-critical$" 'pods: "10000"'; do
  grep -q -- "$want" "$work/quota.yaml" || { echo "check.sh: the critical pods' quota renders no '$want'" >&2; exit 1; }
done
"$helm" template podha "$chart" --kube-version "$kube" --set criticalPodsQuota.create=true --set agent.enabled=false \
  --show-only templates/critical-pods-quota.yaml > "$work/quota.yaml"
if grep -q "system-node-critical" "$work/quota.yaml"; then
  echo "check.sh: the quota covers the agent's class with the agent off" >&2; exit 1
fi
if "$helm" template podha "$chart" --kube-version "$kube" --set criticalPodsQuota.create=true --set agent.enabled=false \
     --set priorityClassName=high > "$work/quota.out" 2>&1 || ! grep -q "nothing for the quota to admit" "$work/quota.out"; then
  echo "check.sh: a quota without a critical class in use must be refused:" >&2; cat "$work/quota.out" >&2; exit 1
fi

# The agent's DaemonSet passes the watchdog only when a device is given, and checks that it is
# one.
grep -q -- "--watchdog=/dev/watchdog" "$work/full.yaml" && grep -q -- "--watchdog-timeout=15s" "$work/full.yaml" \
  && grep -q -- "--survey-timeout=2s" "$work/full.yaml" \
  && grep -q "type: CharDevice" "$work/full.yaml" && grep -q -- "--hearing-file=/run/podha-agent/heard" "$work/full.yaml" \
  && grep -q -- "--leader-lease=podha-lead$" "$work/full.yaml" \
  || { echo "check.sh: the agent's DaemonSet does not pass its watchdog, its hearing file or the leader Lease it reads podha's key from" >&2; exit 1; }
# The hearing file and the saved peer list outlive the pod (a rollout, an eviction) in a
# directory of the node's own under the node's /run; never in an emptyDir, which a new pod
# starts empty (a new agent would count a node podha heard and lost as never heard).
for want in "^ *path: /run/podha-agent$" "type: DirectoryOrCreate" 'subPathExpr: $(PODHA_AGENT_NODE)'; do
  grep -q -- "$want" "$work/full.yaml" \
    || { echo "check.sh: the agent's DaemonSet does not keep its records on the node ('$want')" >&2; exit 1; }
done
if grep -q "emptyDir" "$work/full.yaml"; then
  echo "check.sh: the agent's records are in an emptyDir: a new pod would start never heard" >&2; exit 1
fi
# The boot history outlives reboots, in a directory of the node's own under the node's /var/lib
# (nodes that share a host, as the sim's real nodes do, never share it): an agent without it
# acknowledges no fence request of an earlier boot.
for want in "--boot-history-file=/var/lib/podha-agent/boots" "^ *path: /var/lib/podha-agent$"; do
  grep -q -- "$want" "$work/full.yaml" \
    || { echo "check.sh: the agent's DaemonSet does not keep its boot history on the node ('$want')" >&2; exit 1; }
done
# A fence that writes to a BMC interface through an extra hostPath, a watchdog that is no
# device (the sim's real nodes: e2e/sim/src/chart_install.rs).
cat > "$work/bmc.yaml" <<'VALUES'
agent:
  enabled: true
  fence: write:/run/bmc/power=off
  watchdog: { device: /run/bmc/watchdog, timeout: 10s, mountFromHost: true, hostPathType: "" }
  extraVolumes: [{ name: bmc, hostPath: { path: /run/bmc, type: Directory } }]
  extraVolumeMounts: [{ name: bmc, mountPath: /run/bmc }]
VALUES
"$helm" lint --strict "$chart" -f "$work/bmc.yaml"
"$helm" template podha "$chart" --kube-version "$kube" -f "$work/bmc.yaml" > "$work/bmc.out"
for want in "--fence=write:/run/bmc/power=off" "mountPath: /run/bmc" "path: /run/bmc$" "type: Directory"; do
  grep -q -- "$want" "$work/bmc.out" || { echo "check.sh: the BMC values render no '$want'" >&2; exit 1; }
done
# A check holding what YAML would cut short (` #`) or read as a map (`: `) reaches the agent
# whole: the args are quoted.
"$helm" template podha "$chart" --kube-version "$kube" -f "$work/bmc.yaml" \
  --set-string 'agent.fenceConfirm=command:test -e /run/off # state: off' > "$work/confirm.out"
grep -qF -- '- "--fence-confirm=command:test -e /run/off # state: off"' "$work/confirm.out" \
  || { echo "check.sh: agent.fenceConfirm does not reach the agent whole" >&2; exit 1; }
if grep -q "type: CharDevice" "$work/bmc.out"; then
  echo "check.sh: hostPathType \"\" still checks the watchdog as a CharDevice" >&2; exit 1
fi

# The admission policies that bind each trusted write to its writer: on by default, with the
# release's own accounts and the configured acknowledgers; refused, not silently dropped, on a
# Kubernetes too old to enforce them.
for want in "name: podha-node-annotations" "name: podha-leases" "name: podha-tokens" "name: podha-heartbeat-key" "system:serviceaccount:default:podha-agent'" \
            "system:serviceaccount:default:podha'" "'kubernetes.io/service-account-token'"; do
  grep -q -- "$want" "$work/default.yaml" \
    || { echo "check.sh: the default values render no admission policy '$want'" >&2; exit 1; }
done
[ "$(grep -c "^kind: ValidatingAdmissionPolicyBinding$" "$work/default.yaml")" = 4 ] \
  || { echo "check.sh: the default values do not bind the four admission policies" >&2; exit 1; }
if "$helm" template podha "$chart" --kube-version "$kube" --set serviceAccount.create=false > "$work/sa.out" 2>&1 \
  || ! grep -q "not the namespace's default" "$work/sa.out"; then
  echo "check.sh: the admission policies must refuse to trust the namespace's default ServiceAccount:" >&2; cat "$work/sa.out" >&2; exit 1
fi
"$helm" template podha "$chart" --kube-version "$kube" --set 'rbac.fenceAcknowledgers={system:serviceaccount:fencing:fencer}' \
  --show-only templates/admission-policies.yaml > "$work/acks.yaml"
grep -q "in \['system:serviceaccount:fencing:fencer'\]" "$work/acks.yaml" \
  || { echo "check.sh: rbac.fenceAcknowledgers does not reach the node annotations policy" >&2; exit 1; }
# One minimum version, 1.32 (Chart.yaml's kubeVersion), with or without the admission policies.
for policies in true false; do
  if "$helm" template podha "$chart" --kube-version 1.31.0 --set "rbac.admissionPolicies=$policies" > "$work/old.out" 2>&1 \
    || ! grep -q "requires kubeVersion: >=1.32" "$work/old.out"; then
    echo "check.sh: Kubernetes 1.31 must be refused (rbac.admissionPolicies=$policies):" >&2; cat "$work/old.out" >&2; exit 1
  fi
done
"$helm" template podha "$chart" --kube-version "$kube" --set rbac.admissionPolicies=false > "$work/off.out"
if grep -q "ValidatingAdmissionPolicy" "$work/off.out"; then
  echo "check.sh: rbac.admissionPolicies=false still renders an admission policy" >&2; exit 1
fi

# The schema refuses wrong types, unknown keys and durations the binary would reject.
for bad in replicaCount=two serviceMonitr.enabled=true leaderElection.leaseDuration=15 \
           prometheusRule.failoverSlowSeconds=100 agent.fence=reboot agent.fence=write:power=off \
           agent.isolationTimeout=30 agent.surveyTimeout=soon agent.watchdog.hostPathType=Directory \
           "rbac.fenceAcknowledgers={it's}" leaderElection.leaseName=podha-agent-x criticalPodsQuota.pods=0 \
           podMonitor.agents=yes; do
  if "$helm" template podha "$chart" --kube-version "$kube" --set "$bad" > "$work/bad.out" 2>&1; then
    echo "check.sh: helm template --set $bad rendered; the values schema must refuse it" >&2; exit 1
  fi
  grep -q "values don't meet the specifications of the schema" "$work/bad.out" \
    || { echo "check.sh: --set $bad failed, but not with a schema error:" >&2; cat "$work/bad.out" >&2; exit 1; }
done

# The alert rules, as rendered (everything below `spec:`, dedented), through promtool.
"$helm" template podha "$chart" --kube-version "$kube" -f "$here/values-full.yaml" \
  --show-only templates/prometheusrule.yaml \
  | sed -n '/^spec:$/,$p' | tail -n +2 | sed 's/^  //' > "$work/podha-rules.yaml"
"$promtool" check rules "$work/podha-rules.yaml"
cp "$here/alerts-test.yaml" "$work/"
(cd "$work" && "$promtool" test rules alerts-test.yaml)
# NOTES.txt as helm prints it after an install (helm template leaves it out: render it through
# a copy of the chart where a template of its own holds it), for the default values and with
# policies, and its shell commands: every heredoc they open is closed by its terminator alone on
# a line (an indented one never closes, and a pasted block hangs the shell), the commands parse,
# and nothing is chained after a port-forward, which runs until stopped.
cp -r "$chart" "$work/notes-chart"
cp "$chart/templates/NOTES.txt" "$work/notes-chart/notes.txt"
rm "$work/notes-chart/templates/NOTES.txt"
printf '%s\n' 'notes: |' '{{ tpl (.Files.Get "notes.txt") . | indent 2 }}' > "$work/notes-chart/templates/zz-notes.yaml"
for values in "" "-f $here/values-full.yaml"; do
  # shellcheck disable=SC2086 # $values is empty or two words
  "$helm" template podha "$work/notes-chart" --kube-version "$kube" $values \
    --show-only templates/zz-notes.yaml | sed -n '/^notes: |$/,$p' | tail -n +2 | sed 's/^  //' > "$work/notes.txt"
  grep -q "kubectl" "$work/notes.txt" || { echo "check.sh: NOTES.txt did not render:" >&2; cat "$work/notes.txt" >&2; exit 1; }
  for end in $(grep -o "<<'[A-Za-z0-9_]*'" "$work/notes.txt" | tr -d "<'"); do
    grep -qx "$end" "$work/notes.txt" \
      || { echo "check.sh: NOTES.txt opens a heredoc <<'$end' it never closes ($end alone on a line)" >&2; exit 1; }
  done
  if grep -n "port-forward.*&&" "$work/notes.txt" >&2; then
    echo "check.sh: NOTES.txt chains a command after a port-forward, which never returns" >&2; exit 1
  fi
  # The command lines (indented by two spaces) and the heredocs they open, as a shell reads them.
  awk '/^  [a-z]/ || body { print } /<<.[A-Z]+.$/ { body = 1 } body && /^[A-Z]+$/ { body = 0 }' \
    "$work/notes.txt" > "$work/notes.sh"
  if ! bash -n "$work/notes.sh" 2> "$work/notes.err" || [ -s "$work/notes.err" ]; then
    echo "check.sh: NOTES.txt's commands do not parse:" >&2; cat "$work/notes.err" "$work/notes.sh" >&2; exit 1
  fi
done
echo "chart checks passed"
