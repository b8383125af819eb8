"""The communication term of a step predicted for a GPU cluster: each collective of the
compiled program (`tools/hlo/collectives`) timed over the links its device groups cross.
Uncalibrated: no multi-GPU step has been measured; every number from it is predicted.

    rows = collective_rows(found, mesh.shape, hosts_of, "NVIDIA H100 80GB HBM3")
    seconds = sum(r["predicted_s"] for r in rows)

A collective moves `link_bytes` per device (a ring's share: (n - 1) / n of an all-gather's
result or a reduce-scatter's operand, twice that for an all-reduce, a permute's buffer
whole), at one link's bandwidth in one direction: NVLink when its group stays within a
host, the network when it spans hosts (the slowest link a ring crosses bounds it). The
bandwidths (`LINKS`) are public specs, not measurements:

- H100 / H200 SXM: NVLink 4, 900 GB/s per GPU in both directions together, 450 GB/s each
  way; a DGX / HGX H100 node has 8 x 400 Gb/s NDR InfiniBand, 50 GB/s per GPU each way.
- A100 SXM: NVLink 3, 600 GB/s (300 each way); 8 x 200 Gb/s HDR, 25 GB/s per GPU.

Left out: collectives overlapping compute (XLA's latency-hiding scheduler overlaps some),
NCCL's latency per launch (small messages), hierarchical algorithms that send less over
the network than a flat ring, and congestion. The step with communication is given both
ways: added to the compute (nothing overlaps) and as the larger of the two (everything
overlaps); a measured multi-GPU step will say where between them it lies.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

from t5lite.tools.hlo.collectives import Collective, group_axes, spans_hosts

LINKS: Dict[str, Tuple[float, float]] = {   # (within a host, across hosts), bytes/s each way
    "H100": (450e9, 50e9),
    "H200": (450e9, 50e9),
    "A100": (300e9, 25e9),
}
DEFAULT_LINK = "H100"


def bandwidths(device_kind: str) -> Tuple[float, float]:
    """(NVLink, network) bytes/s each way for a device kind ("NVIDIA H100 80GB HBM3")."""
    for name, links in LINKS.items():
        if name in device_kind:
            return links
    return LINKS[DEFAULT_LINK]


def collective_rows(found: Sequence[Collective], mesh_shape: Mapping[str, int],
                    hosts_of: Sequence[int], device_kind: str) -> List[Dict[str, Any]]:
    """The program's collectives grouped by kind, the mesh axes their groups span and
    whether they cross hosts: launches a step, bytes a device (one launch's buffer times
    launches), link bytes, predicted seconds; the most expensive first."""
    within, across = bandwidths(device_kind)
    rows: Dict[tuple, Dict[str, Any]] = {}
    for c in found:
        axes = group_axes(c.groups, mesh_shape)
        crosses = spans_hosts(c.groups, hosts_of)
        row = rows.setdefault((c.kind, axes, crosses), {
            "kind": c.kind, "mesh_axes": list(axes), "across_hosts": crosses, "launches": 0,
            "bytes": 0.0, "link_bytes": 0.0, "predicted_s": 0.0})
        row["launches"] += c.count
        row["bytes"] += c.count * c.bytes
        row["link_bytes"] += c.count * c.link_bytes()
        row["predicted_s"] += c.count * c.link_bytes() / (across if crosses else within)
    return sorted(rows.values(), key=lambda r: -r["predicted_s"])


def summary(rows: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """Bytes and seconds a step, within hosts and across them."""
    out = {"within_hosts_bytes": 0.0, "across_hosts_bytes": 0.0, "within_hosts_s": 0.0,
           "across_hosts_s": 0.0}
    for r in rows:
        where = "across_hosts" if r["across_hosts"] else "within_hosts"
        out[f"{where}_bytes"] += r["link_bytes"]
        out[f"{where}_s"] += r["predicted_s"]
    out["predicted_comm_s"] = out["within_hosts_s"] + out["across_hosts_s"]
    return out
