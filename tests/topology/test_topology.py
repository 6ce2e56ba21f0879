"""placer.topology: presets, path matrices on hand-made clusters, and every schema error."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.errors import TopologyError, UsageError
from placer.topology import (
    GpuType,
    LinkClass,
    load_topology,
    preset_names,
    topology_from_dict,
    topology_from_text,
)

INF = math.inf

H100 = {"memory_gb": 80, "hbm_gbps": 3350, "bf16_tflops": 989, "fp8_tflops": 1979}

#: GPUs and nodes of every preset the issue asks for.
PRESETS = {
    "dgx-h100": (8, 1),
    "dgx-h200": (8, 1),
    "2x-dgx-h100": (16, 2),
    "4x-dgx-h100": (32, 4),
    "hgx-b200": (8, 1),
    "gb200-nvl72": (72, 1),
    "2x-gb200-nvl72": (144, 2),
    "8x-l40s-pcie": (8, 1),
    "8x-mi300x": (8, 1),
    "2x8-mi300x-roce": (16, 2),
}


@pytest.fixture
def two_by_two() -> dict:
    """2 nodes x 2 GPUs: switch 100 GB/s (1 us GPU to GPU), NIC 10 GB/s, network 4 us."""
    return {
        "name": "two-by-two",
        "gpu_types": {"h100": dict(H100)},
        "nodes": [
            {
                "name": "n",
                "count": 2,
                "gpus": 2,
                "gpu_type": "h100",
                "fabric": {"kind": "nvswitch", "gbps": 100, "latency_us": 1.0},
                "nic_gbps": 10,
            }
        ],
        "network": {"kind": "infiniband", "latency_us": 4.0},
    }


@pytest.fixture
def irregular_pcie() -> dict:
    """4 GPUs, no fabric: gpu0, gpu1 behind sw0 (16 GB/s links, 0.5 us each), gpu2, gpu3
    behind sw1; sw0 reaches the root at 8 GB/s and sw1 at 12 GB/s (0.25 us each)."""
    links = [
        ("n0/gpu0", "sw0", 16, 0.5),
        ("n0/gpu1", "sw0", 16, 0.5),
        ("n0/gpu2", "sw1", 16, 0.5),
        ("n0/gpu3", "sw1", 16, 0.5),
        ("sw0", "root", 8, 0.25),
        ("sw1", "root", 12, 0.25),
    ]
    return {
        "name": "irregular",
        "gpu_types": {"l40s": {**H100, "memory_gb": 48}},
        "nodes": [{"name": "n0", "gpus": 4, "gpu_type": "l40s", "fabric": {"kind": "none"}}],
        "switches": ["sw0", "sw1", "root"],
        "links": [
            {"a": a, "b": b, "gbps": gbps, "latency_us": lat, "kind": "pcie"}
            for a, b, gbps, lat in links
        ],
    }


# -- presets --------------------------------------------------------------------------


def test_every_issue_preset_is_shipped():
    assert set(PRESETS) <= set(preset_names())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_loads_with_consistent_matrices(name):
    topo = load_topology(name)
    g, n = PRESETS[name]
    assert (topo.num_gpus, topo.num_nodes) == (g, n)
    assert topo.source == f"preset {name}"
    assert np.array_equal(topo.bandwidth_gbps, topo.bandwidth_gbps.T)
    assert np.array_equal(topo.latency_us, topo.latency_us.T)
    assert np.all(np.diag(topo.bandwidth_gbps) == INF)
    assert np.all(np.diag(topo.latency_us) == 0)
    off = ~np.eye(g, dtype=bool)
    assert np.all(topo.bandwidth_gbps[off] > 0) and np.all(np.isfinite(topo.bandwidth_gbps[off]))
    # rank order is node-major
    assert np.all(np.diff(topo.node_of_gpu) >= 0)
    assert topo.graph.nodes[topo.gpu_names[5]]["rank"] == 5


def test_preset_files_have_a_source_comment():
    folder = Path(__file__).resolve().parents[2] / "placer" / "data" / "topologies"
    for name in PRESETS:
        text = (folder / f"{name}.yaml").read_text()
        assert text.startswith("#") and "Source" in text, name


def test_top_level_topologies_folder_holds_the_presets():
    """The repository's topologies/ is the packaged folder (one copy of each file)."""
    top = Path(__file__).resolve().parents[2] / "topologies"
    assert sorted(p.stem for p in top.glob("*.yaml")) == preset_names()
    topo = load_topology(str(top / "2x-dgx-h100.yaml"))
    assert topo.name == "2x-dgx-h100" and topo.source.endswith("2x-dgx-h100.yaml")


def test_dgx_h100_figures():
    topo = load_topology("DGX-H100")
    assert topo.memory_gb.tolist() == [80.0] * 8
    assert topo.hbm_gbps[0] == 3350
    assert set(topo.bandwidth_gbps[np.triu_indices(8, 1)]) == {450.0}
    assert topo.injection_gbps[0].tolist() == [INF, 450.0, 50.0]
    assert topo.tflops("fp8")[0] == 1979 and topo.tflops("mxfp4")[0] == 1979


def test_4x_dgx_h100_classes_and_nic_bottleneck():
    topo = load_topology("4x-dgx-h100")
    assert topo.node_of_gpu.tolist() == [i // 8 for i in range(32)]
    assert topo.link_class[0, 7] == LinkClass.INTRA_NODE
    assert topo.link_class[7, 8] == LinkClass.INTER_NODE
    assert topo.link_class[3, 3] == LinkClass.SAME_GPU
    assert topo.bandwidth_gbps[0, 31] == 50.0 and topo.latency_us[0, 31] == 2.0
    assert topo.node_names == ("node0", "node1", "node2", "node3")


def test_mi300x_mesh_injection_is_the_sum_of_its_links():
    topo = load_topology("8x-mi300x")
    assert topo.bandwidth_gbps[0, 1] == 64.0
    assert topo.injection_gbps[0, LinkClass.INTRA_NODE] == 7 * 64.0


def test_nvl72_is_one_nvlink_domain():
    topo = load_topology("gb200-nvl72")
    assert np.all(topo.link_class[~np.eye(72, dtype=bool)] == LinkClass.INTRA_NODE)
    assert topo.bandwidth_gbps[0, 71] == 900.0


def test_l40s_pcie_pairs_sockets_and_no_nvlink():
    topo = load_topology("8x-l40s-pcie")
    bw, lat = topo.bandwidth_gbps, topo.latency_us
    assert (bw[0, 1], lat[0, 1]) == (31.5, 2.0)  # same PCIe switch
    assert (bw[0, 2], lat[0, 2]) == (31.5, 3.0)  # same socket, other switch
    assert (bw[0, 4], lat[0, 4]) == (20.0, 4.0)  # across sockets
    assert topo.injection_gbps[0].tolist() == [INF, 31.5, INF]  # no NIC


def test_arrays_are_read_only():
    topo = load_topology("dgx-h100")
    with pytest.raises(ValueError):
        topo.bandwidth_gbps[0, 1] = 1.0


def test_gpu_type_tflops_by_dtype():
    gpu = GpuType("b200", 180, 8000, 2250, 4500, 9000)
    assert [gpu.tflops(d) for d in ("bf16", "fp8", "mxfp4")] == [2250, 4500, 9000]
    with pytest.raises(UsageError, match="unknown dtype 'int4'"):
        gpu.tflops("int4")


# -- matrices on hand-made topologies ------------------------------------------------


def test_two_by_two_matrices(two_by_two):
    topo = topology_from_dict(two_by_two)
    assert topo.gpu_names == ("n0/gpu0", "n0/gpu1", "n1/gpu0", "n1/gpu1")
    expected_bw = np.array(
        [[INF, 100, 10, 10], [100, INF, 10, 10], [10, 10, INF, 100], [10, 10, 100, INF]]
    )
    expected_lat = np.array([[0, 1, 4, 4], [1, 0, 4, 4], [4, 4, 0, 1], [4, 4, 1, 0]])
    assert np.array_equal(topo.bandwidth_gbps, expected_bw)
    assert np.array_equal(topo.latency_us, expected_lat)
    assert topo.link_class.tolist() == [[0, 1, 2, 2], [1, 0, 2, 2], [2, 2, 0, 1], [2, 2, 1, 0]]
    assert topo.injection_gbps.tolist() == [[INF, 100, 10]] * 4
    roles = nx.get_node_attributes(topo.graph, "role")
    assert sorted(set(roles.values())) == ["gpu", "network", "nic", "switch"]


def test_irregular_pcie_matrices(irregular_pcie):
    topo = topology_from_dict(irregular_pcie)
    bw, lat = topo.bandwidth_gbps, topo.latency_us
    assert bw[0, 1] == 16 and lat[0, 1] == 1.0
    assert bw[0, 2] == 8 and lat[0, 2] == 1.5  # bottleneck: sw0's 8 GB/s uplink
    assert bw[2, 3] == 16
    assert bw[1, 3] == 8
    assert topo.injection_gbps[:, 1].tolist() == [16] * 4


def test_lowest_latency_path_wins_then_widest(irregular_pcie):
    """A direct 4 GB/s link at 1 us beats the 8 GB/s route at 1.5 us; at equal latency
    the wider of two routes is taken."""
    data = dict(irregular_pcie)
    data["links"] = [
        *irregular_pcie["links"],
        {"a": "n0/gpu1", "b": "n0/gpu2", "gbps": 4, "latency_us": 1.0},
    ]
    topo = topology_from_dict(data)
    assert (topo.bandwidth_gbps[1, 2], topo.latency_us[1, 2]) == (4, 1.0)
    assert (topo.bandwidth_gbps[0, 2], topo.latency_us[0, 2]) == (8, 1.5)
    data["links"][-1] = {"a": "n0/gpu1", "b": "n0/gpu2", "gbps": 4, "latency_us": 1.5}
    topo = topology_from_dict(data)
    assert (topo.bandwidth_gbps[1, 2], topo.latency_us[1, 2]) == (8, 1.5)


def test_pcie_shorthand_equals_explicit_links(irregular_pcie):
    shorthand = {
        "name": "short",
        "gpu_types": irregular_pcie["gpu_types"],
        "nodes": [
            {
                "name": "n0",
                "gpus": 4,
                "gpu_type": "l40s",
                "fabric": {"kind": "pcie", "gbps": 16, "latency_us": 1.0, "gpus_per_switch": 2},
            }
        ],
    }
    links = [dict(link, latency_us=0.5) for link in irregular_pcie["links"]]
    for link in links:
        if link["b"] == "root":
            link["gbps"] = 16
    explicit = dict(irregular_pcie, links=links)
    a, b = topology_from_dict(shorthand), topology_from_dict(explicit)
    assert np.array_equal(a.bandwidth_gbps, b.bandwidth_gbps)
    assert np.array_equal(a.latency_us, b.latency_us)


def test_gpus_do_not_forward_traffic():
    """gpu0 - gpu1 - gpu2 in a chain: gpu0 cannot use gpu1 as a relay."""
    data = {
        "name": "chain",
        "gpu_types": {"h100": dict(H100)},
        "nodes": [{"name": "n", "gpus": 3, "gpu_type": "h100"}],
        "links": [
            {"a": "n/gpu0", "b": "n/gpu1", "gbps": 10},
            {"a": "n/gpu1", "b": "n/gpu2", "gbps": 10},
        ],
    }
    with pytest.raises(TopologyError) as e:
        topology_from_dict(data)
    assert str(e.value) == (
        "<dict>: nodes[0]: GPUs n/gpu0 and n/gpu2 cannot reach each other"
        " (2 ordered pairs unreachable)"
    )
    assert e.value.hint == "give the node a fabric, or add links: between them"


def _brute_force(graph: nx.Graph, a: str, b: str) -> tuple[float, float]:
    """(bandwidth, latency) of the lowest-latency then widest simple path avoiding GPUs."""
    best: tuple[float, float] | None = None
    for path in nx.all_simple_paths(graph, a, b):
        if any(graph.nodes[v]["role"] == "gpu" for v in path[1:-1]):
            continue
        edges = [graph.edges[u, v] for u, v in itertools.pairwise(path)]
        lat = round(sum(e["latency_us"] for e in edges), 9)
        bw = min(e["gbps"] for e in edges)
        if best is None or (lat, -bw) < (best[1], -best[0]):
            best = (bw, lat)
    assert best is not None
    return best


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),
            st.integers(0, 5),
            st.sampled_from([4, 8, 16]),
            st.sampled_from([0.5, 1.0, 1.5]),
        ),
        min_size=4,
        max_size=12,
    )
)
def test_paths_match_brute_force(edges):
    """Random irregular boxes (3 GPUs, 3 switches): matrices equal an exhaustive search."""
    vertices = ["n/gpu0", "n/gpu1", "n/gpu2", "s0", "s1", "s2"]
    # a star through s0 keeps every example connected
    links = {("n/gpu0", "s0"): (32, 2.0), ("n/gpu1", "s0"): (32, 2.0), ("n/gpu2", "s0"): (32, 2.0)}
    for i, j, gbps, lat in edges:
        a, b = sorted((vertices[i], vertices[j]))
        if a != b:
            links.setdefault((a, b), (gbps, lat))
    data = {
        "name": "random",
        "gpu_types": {"h100": dict(H100)},
        "nodes": [{"name": "n", "gpus": 3, "gpu_type": "h100"}],
        "switches": ["s0", "s1", "s2"],
        "links": [
            {"a": a, "b": b, "gbps": gbps, "latency_us": lat}
            for (a, b), (gbps, lat) in links.items()
        ],
    }
    topo = topology_from_dict(data)
    for x, y in itertools.permutations(range(3), 2):
        bw, lat = _brute_force(topo.graph, topo.gpu_names[x], topo.gpu_names[y])
        assert topo.bandwidth_gbps[x, y] == bw
        assert topo.latency_us[x, y] == pytest.approx(lat)


# -- validation errors, each with its message -----------------------------------------

GOOD = """\
name: t
gpu_types:
  h100: {memory_gb: 80, hbm_gbps: 3350, bf16_tflops: 989, fp8_tflops: 1979}
nodes:
  - name: node0
    gpus: 8
    gpu_type: h100
    fabric: {kind: nvswitch, gbps: 450}
    nic_gbps: 50
"""


def _error(text: str) -> TopologyError:
    with pytest.raises(TopologyError) as e:
        topology_from_text(text, "t.yaml")
    return e.value


def test_good_text_loads():
    topo = topology_from_text(GOOD, "t.yaml")
    assert topo.num_gpus == 8 and topo.latency_us[0, 1] == 1.0  # default NVSwitch latency


@pytest.mark.parametrize(
    ("old", "new", "message", "hint"),
    [
        (
            "gpu_type: h100\n",
            "gpu_type: h200\n",
            "t.yaml:7: nodes[0].gpu_type: unknown GPU type 'h200'",
            "gpu_types defines: h100",
        ),
        (
            "memory_gb: 80, ",
            "",
            "t.yaml:3: gpu_types.h100: missing key 'memory_gb'",
            "add 'memory_gb: ...' at this place",
        ),
        (
            "memory_gb: 80",
            "memory_gb: -80",
            "t.yaml:3: gpu_types.h100.memory_gb: memory_gb must be positive, got -80",
            "give memory_gb a positive value",
        ),
        (
            "gbps: 450",
            "gbps: 0",
            "t.yaml:8: nodes[0].fabric.gbps: gbps must be positive, got 0",
            "a link without bandwidth carries nothing; remove it or give its GB/s",
        ),
        (
            "nic_gbps: 50",
            "nic_gbps: fast",
            "t.yaml:9: nodes[0].nic_gbps: nic_gbps must be a number, got a string 'fast'",
            "write nic_gbps: followed by a number",
        ),
        (
            "gbps: 450",
            "gbs: 450",
            "t.yaml:8: nodes[0].fabric: missing key 'gbps'",
            "found 'gbs': did you mean 'gbps'?",
        ),
        (
            "    nic_gbps: 50\n",
            "    nic_gbps: 50\n    nic_gpbs: 50\n",
            "t.yaml:10: nodes[0].nic_gpbs: unknown key 'nic_gpbs'",
            "did you mean 'nic_gbps'? allowed keys: count, fabric, gpu_type, gpus, name, nic_gbps",
        ),
        (
            "kind: nvswitch",
            "kind: nvlink",
            "t.yaml:8: nodes[0].fabric.kind: unknown kind 'nvlink'",
            "expected one of: nvswitch, switch, mesh, pcie, none",
        ),
        (
            "gpus: 8",
            "gpus: 0",
            "t.yaml:6: nodes[0].gpus: gpus must be at least 1, got 0",
            "give gpus a whole number of at least 1",
        ),
        (
            "name: t\n",
            "name: t\nname: u\n",
            "t.yaml:2: name: duplicate key name (first given on line 1)",
            "keep one of the two (YAML takes each key once)",
        ),
        (
            "nodes:\n",
            "nodes: []\nx:\n",
            "t.yaml:4: nodes: nodes is empty",
            "list at least one node",
        ),
        (
            "gpus: 8",
            "gpus: [8",
            "t.yaml:7: not valid YAML: expected ',' or ']', but got ':'",
            "check the indentation and brackets at this line",
        ),
    ],
)
def test_schema_errors(old, new, message, hint):
    assert old in GOOD
    error = _error(GOOD.replace(old, new, 1))
    assert str(error) == message
    assert error.hint == hint


def test_duplicate_node_names():
    text = (
        GOOD + "  - {name: node0, gpus: 8, gpu_type: h100, fabric: {kind: nvswitch, gbps: 450}}\n"
    )
    text += "network: {kind: infiniband}\n"
    error = _error(text)
    assert str(error) == "t.yaml:10: nodes[1].name: duplicate node name 'node0' (also nodes[0])"
    assert error.hint == "give every node a different name"


def test_count_names_collide_with_an_explicit_node():
    text = GOOD.replace("name: node0", "name: node\n    count: 2") + (
        "  - {name: node1, gpus: 8, gpu_type: h100, fabric: {kind: nvswitch, gbps: 450}}\n"
        "network: {kind: infiniband}\n"
    )
    assert "duplicate node name 'node1' (also nodes[0])" in str(_error(text))


def test_several_nodes_need_a_network():
    text = GOOD.replace("name: node0", "name: node\n    count: 2")
    error = _error(text)
    assert str(error) == "t.yaml:1: missing key 'network': 2 nodes need a network between them"
    assert error.hint == "add e.g. network: {kind: infiniband, latency_us: 2.0}"


def test_node_without_nic_cannot_reach_other_nodes():
    text = (
        GOOD.replace("name: node0", "name: node\n    count: 2").replace("    nic_gbps: 50\n", "")
        + "network: {kind: roce}\n"
    )
    error = _error(text)
    assert str(error) == (
        "t.yaml:5: nodes[0]: GPUs node0/gpu0 and node1/gpu0 cannot reach each other"
        " (128 ordered pairs unreachable)"
    )
    assert error.hint == "give both nodes nic_gbps and the file a network:"


def test_link_errors():
    base = GOOD + "switches: [plx]\nlinks:\n"
    error = _error(base + "  - {a: node0/gpu0, b: plx9, gbps: 10}\n")
    assert str(error) == "t.yaml:12: links[0].b: unknown vertex 'plx9'"
    error = _error(base + "  - {a: node0/gpu0, b: plx, gbps: 0}\n")
    assert str(error) == "t.yaml:12: links[0].gbps: gbps must be positive, got 0"
    error = _error(base + "  - {a: plx, b: plx, gbps: 1}\n")
    assert str(error) == "t.yaml:12: links[0]: link from 'plx' to itself"
    error = _error(base + "  - {a: node0/gpu0, b: node0/nvswitch, gbps: 1}\n")
    assert (
        str(error)
        == "t.yaml:12: links[0]: duplicate link between 'node0/gpu0' and 'node0/nvswitch'"
    )
    error = _error(GOOD + "switches: [node0/gpu3]\n")
    assert str(error) == "t.yaml:10: switches[0]: duplicate vertex name 'node0/gpu3'"


def test_document_must_be_a_mapping():
    assert str(_error("- 1\n- 2\n")) == "t.yaml:1: expected a mapping for the document, got a list"


def test_unknown_preset_suggests_a_close_name():
    with pytest.raises(TopologyError) as e:
        load_topology("dgx-h10")
    assert str(e.value) == "topology: unknown topology 'dgx-h10': not a preset and no such file"
    assert e.value.hint is not None and e.value.hint.startswith("did you mean 'dgx-h100'? presets:")


def test_missing_file(tmp_path):
    with pytest.raises(TopologyError) as e:
        load_topology(tmp_path / "nope.yaml")
    assert str(e.value) == f"{tmp_path / 'nope.yaml'}: file not found"


def test_yaml_anchors_and_merge_keys():
    """The first node is reused with <<: *anchor; own keys override inherited ones."""
    text = """\
name: merged
gpu_types:
  h100: {memory_gb: 80, hbm_gbps: 3350, bf16_tflops: 989, fp8_tflops: 1979}
nodes:
  - &dgx {name: a, gpus: 8, gpu_type: h100, fabric: {kind: nvswitch, gbps: 450}, nic_gbps: 50}
  - {<<: *dgx, name: b, gpus: 4}
network: {kind: infiniband}
"""
    topo = topology_from_text(text, "t.yaml")
    assert topo.node_names == ("a", "b")
    assert topo.gpus_per_node.tolist() == [8, 4]
    error = _error(text.replace("name: b, gpus: 4", "name: b, gpus: 4, gpus: 2"))
    assert (
        str(error) == "t.yaml:6: nodes[1].gpus: duplicate key nodes[1].gpus (first given on line 6)"
    )


@pytest.mark.parametrize(("typed", "meant"), [
    ("4x-h100", "4x-dgx-h100"), ("2x-h100", "2x-dgx-h100"), ("dgx-h10", "dgx-h100"),
    ("gb200", "gb200-nvl72"), ("2x-nvl72", "2x-gb200-nvl72"), ("mi300x", "8x-mi300x"),
])
def test_an_unknown_topology_suggests_the_preset_that_shares_its_words(
        typed: str, meant: str) -> None:
    with pytest.raises(TopologyError) as caught:
        load_topology(typed)
    assert f"did you mean '{meant}'?" in (caught.value.hint or "")


def test_no_suggestion_for_a_name_near_no_preset() -> None:
    from placer.topology.presets import closest_preset
    assert closest_preset("tpu-v5p-pod", preset_names()) is None
