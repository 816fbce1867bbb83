"""The Pod annotations that attach a PD fabric's secondary networks (the fabric profiles
themselves, what the engines and their transport are told, are ``engines.fabrics``):
Multus NetworkAttachmentDefinitions, or GKE multi-networking interfaces.

* [multus] Multus CNI / SR-IOV network operator: secondary networks attached with the Pod
  annotation ``k8s.v1.cni.cncf.io/networks`` (a comma list of NetworkAttachmentDefinition
  names; a name may repeat, one interface each), one SR-IOV virtual function per entry.
* [gke-multinet] GKE multi-networking: ``networking.gke.io/default-interface`` and
  ``networking.gke.io/interfaces`` (a JSON list of {"interfaceName","network"}), as on
  A3 Ultra / A4 RoCE nodes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from servebook.engines import fabrics

Networking = Literal["multus", "gke"]
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
GKE_DEFAULT_INTERFACE = "networking.gke.io/default-interface"
GKE_INTERFACES = "networking.gke.io/interfaces"


def pod_annotations(
    p: fabrics.Profile, networking: Networking, networks: Sequence[str], count: int
) -> dict[str, str]:
    """The Pod annotations that attach the fabric's secondary networks."""
    if p.networks == "none" or not networks:
        return {}
    if p.networks == "multus-or-gke" and networking == "gke":
        # [gke-multinet] eth0 stays the Pod network; one interface per RDMA network.
        ifaces = [{"interfaceName": "eth0", "network": "default"}]
        ifaces += [{"interfaceName": f"eth{i + 1}", "network": n} for i, n in enumerate(networks)]
        return {GKE_DEFAULT_INTERFACE: "eth0", GKE_INTERFACES: json.dumps(ifaces)}
    # [multus] one attachment per device: a single name is repeated for each.
    names = list(networks) * count if len(networks) == 1 and count > 1 else list(networks)
    return {MULTUS_ANNOTATION: ",".join(names)}
