"""Every pod the operator renders meets the Pod Security Standards "restricted" profile, except where a
job asks for hostPath storage (the single-node quickstart), and mounts no service account token.

The checker below is written from the published profile rules (kubernetes.io/docs/concepts/security/
pod-security-standards: baseline, then restricted); kubernetes-validate checks schemas, not these.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_operator_builders import BUILT, all_children, example_bodies

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}


def violations(pod_spec: dict[str, Any]) -> list[str]:
    """Each rule of the baseline and restricted profiles a pod spec breaks."""
    out: list[str] = []
    psc = pod_spec.get("securityContext") or {}
    containers = [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]
    # --- baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            out.append(f"baseline: {key}")
    for c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append("baseline: privileged")
        if set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS:
            out.append("baseline: capabilities beyond the baseline set")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append("baseline: hostPort")
        if sc.get("procMount", "Default") != "Default":
            out.append("baseline: procMount")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append("baseline: hostProcess")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append("baseline: seccomp Unconfined")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("baseline: seccomp Unconfined")
    if {s.get("name") for s in psc.get("sysctls") or []} - SAFE_SYSCTLS:
        out.append("baseline: unsafe sysctl")
    for v in pod_spec.get("volumes") or []:
        if "hostPath" in v:
            out.append(f"baseline: hostPath volume {v['name']}")
    # --- restricted
    for v in pod_spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"restricted: volume type {sorted(kinds)}")
    for c in containers:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append("restricted: allowPrivilegeEscalation must be false")
        if not (sc.get("runAsNonRoot") is True or (psc.get("runAsNonRoot") is True and sc.get("runAsNonRoot") is not False)):
            out.append("restricted: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append("restricted: runAsUser 0")
        if (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            out.append("restricted: seccompProfile")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append("restricted: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append("restricted: capabilities add beyond NET_BIND_SERVICE")
    return out


def _pod_specs(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for m in all_children(body):
        if m["kind"] == "Pod":
            out.append(("Pod", m["spec"]))
        elif m["kind"] in ("Job", "Deployment"):
            out.append((m["kind"], m["spec"]["template"]["spec"]))
    return out


def _uses_host_path(body: dict[str, Any]) -> bool:
    return any(isinstance(v, dict) and v.get("hostPath") for v in (body["spec"].get("volumes") or {}).values())


@pytest.mark.parametrize("body", example_bodies() + BUILT,
                         ids=lambda b: f"{b['kind']}-{b['metadata']['name']}-{len(str(b['spec']))}")
def test_rendered_pods_are_restricted_unless_on_host_path(body: dict[str, Any]) -> None:
    specs = _pod_specs(body)
    assert specs
    for owner, spec in specs:
        assert spec["automountServiceAccountToken"] is False, owner
        found = violations(spec)
        if owner == "Deployment":   # a third-party model server image: its user is its own business
            found = [v for v in found if v != "restricted: runAsNonRoot"]
        if _uses_host_path(body):
            assert found and all("hostPath" in v for v in found), found
        else:
            assert found == [], (owner, found)
        if owner != "Deployment":   # the trex images run as 65532 and own their volumes through fsGroup
            sc = spec["securityContext"]
            assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"]) == (65532, 65532, 65532)


def test_the_checker_catches_each_rule() -> None:
    bad = {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
           "securityContext": {"seccompProfile": {"type": "Unconfined"}},
           "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}],
                           "securityContext": {"privileged": True, "runAsUser": 0,
                                               "capabilities": {"add": ["SYS_ADMIN"]}}}]}
    found = violations(bad)
    for rule in ("hostNetwork", "privileged", "capabilities beyond", "hostPort", "seccomp Unconfined", "hostPath",
                 "allowPrivilegeEscalation", "runAsNonRoot", "runAsUser 0", "drop ALL", "add beyond"):
        assert any(rule in v for v in found), (rule, found)
