"""Dispatch policies: which replica of an expert serves a (token, expert) selection.

Glossary: a token selects ``top_k`` logical experts per layer; the *k position* of a
selection is its index ``0..top_k-1`` in the token's top-k list; an expert with ``r``
replicas has slots ``logical_to_physical[layer, e, 0..r-1]`` (increasing slot order).

Policies
--------
The three position rules give every selection a *dispatch code* that depends only on the
batch's tokens (never on the placement) and send it to replica ``code mod r``
(:func:`dispatch_codes`):

``vllm_hash`` (vLLM since PR #40810, ``--engine vllm``)
    code ``(rank_position * 2654435769) & 0xFFFFFFFF``, Knuth's multiplicative hash of the
    token's row in its rank's ``topk_ids`` (``_eplb_map_and_record_i32_kernel`` in
    vllm/distributed/eplb/cuda_platform_backend.py): every selection of one token gets
    the same code, whatever its k position.
``trtllm_block`` (TensorRT-LLM's load balancer, ``--engine trtllm``)
    code ``rank_in_block + block + source``: a rank's selections are numbered in row-major
    (token, k position) order and cut into blocks of :data:`TRTLLM_ROUTE_BLOCK`;
    ``rank_in_block`` counts the earlier selections of the same expert in the block,
    ``block`` is the block's index and ``source`` the rank (``offset_by_ep_rank``, on
    under attention DP, where each rank routes its own tokens) -- ``moeComputeRouteKernel``
    in cpp/tensorrt_llm/kernels/moeLoadBalance/moeLoadBalanceKernels.cu.
``round_robin`` (vLLM before PR #40810)
    code ``rank_position * top_k + k_position``: the selections of a forward pass on one
    rank numbered in row-major (token, k position) order, as vLLM's former
    ``pos_indices % replica_count`` did, so replicas are used in turn.  When ``r``
    shares a factor ``d`` with ``top_k``, the k position alone fixes the replica modulo
    ``d``, so the order of each token's top-k list matters (:func:`round_robin_order_bias`
    detects it; the hash above was vLLM's fix).
``sglang`` (current SGLang ``--ep-dispatch-algorithm static``)
    a fixed table ``[source rank, expert] -> slot`` built as SGLang's
    ``compute_logical_to_rank_dispatch_physical_map`` (python/sglang/srt/eplb/
    expert_location.py) builds it: a single replica is used by everyone; else a rank
    that holds a replica uses its lowest slot; else, when some but not all replicas sit
    on the rank's node, the lowest slot on the node; else a seeded fair draw over all
    replicas (:func:`static_dispatch_table`).
``local_first`` (SGLang's earlier static dispatch)
    a rank that holds a replica uses its own; every other rank gets a seeded fair
    draw over all replicas, with no preference for its node.
``random``
    a uniform, seeded choice among the replicas for each selection.

A GPU may hold two replicas of one expert (DeepSeek's EPLB makes such placements).  Every
policy works on slots: round robin and random use each slot in turn or with equal chance,
so that GPU serves two shares; a static table gives a rank that holds the expert its
lowest own slot (SGLang's ``same_gpu_physical_expert_ids[0]``), and the fair draws of the
other ranks are over every slot, both of that GPU's included, as SGLang's candidates are.
"""

from __future__ import annotations

import random as pyrandom
from dataclasses import dataclass

import numpy as np

from placer.errors import Param, PlacementError, PlacerWarning, UsageError
from placer.placement import Placement

#: Policies that read a fixed ``[source rank, expert] -> slot`` table.
STATIC_POLICIES = ("sglang", "local_first")
#: Policies that send a selection to replica ``code mod r`` (:func:`dispatch_codes`).
CODE_POLICIES = ("round_robin", "vllm_hash", "trtllm_block")

#: vLLM's replica hash: ``floor(2**32 / golden ratio)``, kept to 32 bits.
VLLM_HASH_MULTIPLIER = 2654435769
_LOW_32_BITS = 0xFFFFFFFF
#: Selections per block of TensorRT-LLM's routing kernel (256 threads x 4 items).
TRTLLM_ROUTE_BLOCK = 1024

#: SGLang's default seed of its static dispatch table (``seed: int = 42``); the ``sglang``
#: policy draws with ``random.Random(SGLANG_DISPATCH_SEED + seed)``.
SGLANG_DISPATCH_SEED = 42

#: Above this many shuffle steps (sum over fair draws of ``remaining ranks ** 2``, about
#: 2 s of Python's ``random``), the ``sglang`` table's draws are taken from the same
#: distribution instead of SGLang's exact streams (each rank's pick uniform over the
#: replicas, independent): 64 GPUs x DeepSeek-V3 with 64 redundant experts is ~1e7.
SGLANG_EXACT_DRAW_BUDGET = 12_000_000

#: Added to the seed of the ``random`` policy's generator, so it does not share draws
#: with the ``local_first`` table built from the same seed.
_RANDOM_STREAM = 1
_STATIC_STREAM = 2

#: Round-robin order bias: a replicated expert is flagged when the replica class the k
#: position picks most often carries at least this many times an even share ...
ORDER_BIAS_RATIO = 1.1
#: ... and that excess is at least this many binomial standard deviations (noise of a
#: shuffled top-k list), so chance alone essentially never triggers it.
ORDER_BIAS_SIGMAS = 5.0
#: Warn only when using the flagged experts' replicas evenly would move some layer's
#: hot-shard ratio (max / mean GPU load) by at least this much.
ORDER_BIAS_MIN_EFFECT = 0.02


def static_dispatch_table(
    placement: Placement,
    seed: int = 0,
    *,
    policy: str = "local_first",
    node_of_gpu: np.ndarray | None = None,
) -> np.ndarray:
    """A static dispatch table: ``[layers, G, E]`` int64 slot each source rank uses.

    Parameters
    ----------
    placement: the placement (rows in any layer order).
    seed: ``local_first``: seeds ``numpy.random.default_rng((seed, layer_id, 2))`` per
        layer (reproducible, not SGLang's stream).  ``sglang``: each rank draws from
        Python's ``random.Random(42 + seed)``, so seed 0 gives SGLang's own table.
    policy: ``"local_first"`` (SGLang's earlier rule, the default for compatibility) or
        ``"sglang"`` (current SGLang, see module).
    node_of_gpu: ``[G]`` int64 node of each GPU (``Topology.node_of_gpu``); ``sglang``
        only.  None = one node.  SGLang takes node ``rank // (ep_size // nnodes)``,
        which is the topology's node for node-major clusters of equal nodes.

    Returns
    -------
    ``[layers, G, E]`` int64: ``table[row, g, e]`` is the slot serving expert ``e`` for
    tokens whose source rank is ``g``, in layer row ``row`` of ``placement``.

    Raises
    ------
    UsageError: ``policy`` has no static table.
    PlacementError: ``node_of_gpu`` does not have one entry per GPU of the placement.

    Notes
    -----
    ``sglang`` reproduces SGLang's table exactly, random part included, for a
    placement exported with ``placer export -f sglang``.  SGLang builds its table
    once in each rank's process, over all hidden layers (dense layers hold the trivial
    row ``arange(P) % E``), with ``random.Random(42)``; before that it narrows each
    (layer, expert) to the rank's nearest replica when there is one, so a rank's
    generator only advances on the (layer, expert) entries where the rank itself falls
    to the fair draw.  Each rank's draw is therefore its own: the fair share
    (``n // r`` ranks per replica, ``n mod r`` drawn without replacement, shuffled) holds
    within one rank's stream, not across ranks.  Here each rank replays its own stream
    over the layer ids ``0..max(placement.layer_ids)``, with the trivial row where the
    placement has no layer.  That costs about ``G x draws x G`` steps of Python's
    generator; above ``SGLANG_EXACT_DRAW_BUDGET`` each rank's fair pick is drawn
    uniformly and independently instead (the distribution SGLang's per-rank streams
    give, not its table).
    """
    if policy == "local_first":
        return _local_first_table(placement, seed)
    if policy != "sglang":
        raise UsageError(
            f"policy {policy!r} has no static dispatch table", where=Param("policy"),
            hint=f"static policies: {', '.join(STATIC_POLICIES)}",
        )
    if node_of_gpu is None:
        node_of_gpu = np.zeros(placement.num_gpus, dtype=np.int64)
    node_of_gpu = np.asarray(node_of_gpu, dtype=np.int64)
    if node_of_gpu.shape != (placement.num_gpus,):
        raise PlacementError(
            f"node_of_gpu has shape {node_of_gpu.shape}, the placement has"
            f" {placement.num_gpus} GPUs",
            hint="pass topology.node_of_gpu of the cluster the placement was planned for",
        )
    key = (
        placement.physical_to_logical.tobytes(), placement.physical_to_logical.shape,
        placement.layer_ids.tobytes(), placement.num_experts, placement.num_gpus,
        node_of_gpu.tobytes(), seed,
    )
    if key not in _SGLANG_TABLES:
        if len(_SGLANG_TABLES) >= _SGLANG_CACHE:
            _SGLANG_TABLES.pop(next(iter(_SGLANG_TABLES)))
        _SGLANG_TABLES[key] = _sglang_table(placement, SGLANG_DISPATCH_SEED + seed, node_of_gpu)
    return _SGLANG_TABLES[key].copy()


#: The last few ``sglang`` tables (the same placement is often judged on several parts).
_SGLANG_CACHE = 4
_SGLANG_TABLES: dict[tuple[object, ...], np.ndarray] = {}


def _local_first_table(placement: Placement, seed: int) -> np.ndarray:
    """``local_first``: own replica, else a fair share drawn per layer with numpy."""
    num_gpus = placement.num_gpus
    l2p = placement.logical_to_physical
    counts = placement.replica_counts
    slots_per_gpu = placement.slots_per_gpu
    table = np.repeat(l2p[:, None, :, 0], num_gpus, axis=1)  # [L, G, E]
    for row in range(placement.num_layers):
        replicated = np.flatnonzero(counts[row] > 1)
        if replicated.size == 0:
            continue
        rng = np.random.default_rng((seed, int(placement.layer_ids[row]), _STATIC_STREAM))
        for expert in replicated:
            candidates = l2p[row, expert, : counts[row, expert]]
            holders = candidates // slots_per_gpu
            column = _lowest_by(holders, candidates, num_gpus)
            remaining = np.flatnonzero(column < 0)
            if remaining.size:
                q, rem = divmod(remaining.size, candidates.size)
                extra = rng.choice(candidates, size=rem, replace=False)
                choices = np.concatenate([np.tile(candidates, q), extra])
                rng.shuffle(choices)
                column[remaining] = choices
            table[row, :, expert] = column
    return table


@dataclass(frozen=True)
class _FairDraw:
    """One (layer, expert) entry whose ``remaining`` ranks share ``candidates`` by draw."""

    row: int  # placement row, -1 for a layer the placement does not hold (trivial row)
    expert: int
    candidates: list[int]
    remaining: np.ndarray  # [n] int64 ranks, increasing


def _sglang_table(placement: Placement, seed: int, node_of_gpu: np.ndarray) -> np.ndarray:
    """Current SGLang's static table (see :func:`static_dispatch_table`)."""
    num_gpus = placement.num_gpus
    num_experts = placement.num_experts
    slots_per_gpu = placement.slots_per_gpu
    num_nodes = int(node_of_gpu.max()) + 1 if node_of_gpu.size else 1
    l2p = placement.logical_to_physical
    counts = placement.replica_counts
    table = np.repeat(l2p[:, None, :, 0], num_gpus, axis=1)  # [L, G, E]
    row_of_layer = {int(i): row for row, i in enumerate(placement.layer_ids.tolist())}
    trivial = np.arange(placement.num_physical, dtype=np.int64) % num_experts
    draws: list[_FairDraw] = []
    last_layer = int(placement.layer_ids.max()) if placement.num_layers else -1
    for layer_id in range(last_layer + 1):
        row = row_of_layer.get(layer_id, -1)
        p2l = placement.physical_to_logical[row] if row >= 0 else trivial
        layer_counts = counts[row] if row >= 0 else np.bincount(trivial, minlength=num_experts)
        for expert in np.flatnonzero(layer_counts > 1).tolist():
            if row >= 0:
                candidates = l2p[row, expert, : counts[row, expert]]
            else:
                candidates = np.flatnonzero(p2l == expert).astype(np.int64)
            nearest = _nearest_replica(candidates, slots_per_gpu, node_of_gpu, num_nodes)
            remaining = np.flatnonzero(nearest < 0)
            if row >= 0:
                table[row, :, expert] = nearest
            if remaining.size:
                draws.append(_FairDraw(row, expert, candidates.tolist(), remaining))
    work = sum(d.remaining.size ** 2 for d in draws)  # shuffle steps of all the streams
    if work > SGLANG_EXACT_DRAW_BUDGET:
        # same distribution, not the same table: each rank's pick uniform, independent
        rng = np.random.default_rng((seed, _STATIC_STREAM))
        for draw in draws:
            if draw.row >= 0:
                picks = rng.integers(0, len(draw.candidates), size=draw.remaining.size)
                table[draw.row, draw.remaining, draw.expert] = np.asarray(draw.candidates)[picks]
        return table
    # position of each rank among a draw's remaining ranks, -1 where it has a nearest one
    position = np.full((len(draws), num_gpus), -1, dtype=np.int64)
    for i, draw in enumerate(draws):
        position[i, draw.remaining] = np.arange(draw.remaining.size)
    for rank in range(num_gpus):
        stream = pyrandom.Random(seed)
        # only the entries where this rank falls to the draw advance its stream
        for i in np.flatnonzero(position[:, rank] >= 0).tolist():
            draw = draws[i]
            shares = _fair_shares(draw.candidates, draw.remaining.size, stream)
            if draw.row >= 0:
                table[draw.row, rank, draw.expert] = shares[position[i, rank]]
    return table


def _nearest_replica(
    candidates: np.ndarray, slots_per_gpu: int, node_of_gpu: np.ndarray, num_nodes: int
) -> np.ndarray:
    """``[G]`` int64: the lowest replica slot on each rank's GPU, else the lowest on its
    node when the node holds some but not all replicas, else -1 (a fair draw)."""
    gpus = candidates // slots_per_gpu
    nodes = node_of_gpu[gpus]
    own = _lowest_by(gpus, candidates, node_of_gpu.size)
    first_on_node = _lowest_by(nodes, candidates, num_nodes)
    on_node = np.bincount(nodes, minlength=num_nodes)
    narrows = (on_node > 0) & (on_node < candidates.size)
    by_node = np.where(narrows, first_on_node, -1)[node_of_gpu]
    return np.where(own >= 0, own, by_node)


def _lowest_by(group: np.ndarray, slots: np.ndarray, size: int) -> np.ndarray:
    """``[size]`` int64: the lowest of ``slots`` in each group, -1 for an empty group."""
    out = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(out, group, slots)
    return np.where(out == np.iinfo(np.int64).max, -1, out)


def _fair_shares(candidates: list[int], count: int, stream: pyrandom.Random) -> list[int]:
    """``count`` picks sharing ``candidates`` fairly, as SGLang's ``_fair_choices`` draws:
    every candidate ``count // r`` times, ``count mod r`` more drawn without replacement,
    then shuffled (same calls on ``stream``, so the same picks)."""
    whole, extra = divmod(count, len(candidates))
    picks = candidates * whole + stream.sample(candidates, extra)
    stream.shuffle(picks)
    return picks


def dispatch_codes(
    policy: str,
    experts: np.ndarray,
    k_position: np.ndarray,
    source: np.ndarray,
    rank_position: np.ndarray,
    *,
    top_k: int,
    run: np.ndarray | None = None,
) -> np.ndarray:
    """``[n]`` int64 dispatch code of each selection under a position rule: the selection
    goes to replica ``code mod r`` of its expert (module docstring, Policies).

    Parameters
    ----------
    policy: one of :data:`CODE_POLICIES`.
    experts, k_position, source, rank_position: ``[n]`` int64 as :func:`choose_slots`.
    run: ``[n]`` int64 the (batch, source rank) forward pass of each selection;
        ``trtllm_block`` only (its blocks restart on every rank's forward pass), None =
        one pass per source rank.

    Examples
    --------
    >>> import numpy as np
    >>> zeros = np.zeros(3, dtype=np.int64)
    >>> dispatch_codes("vllm_hash", zeros, zeros, zeros, np.arange(3), top_k=1).tolist()
    [0, 2654435769, 1013904242]
    """
    if policy == "round_robin":
        return rank_position * top_k + k_position
    if policy == "vllm_hash":
        return (rank_position * VLLM_HASH_MULTIPLIER) & _LOW_32_BITS
    if policy != "trtllm_block":
        raise ValueError(f"policy {policy!r} has no dispatch codes")
    return _trtllm_codes(experts, k_position, source, rank_position, top_k,
                         source if run is None else run)


def _trtllm_codes(experts: np.ndarray, k_position: np.ndarray, source: np.ndarray,
                  rank_position: np.ndarray, top_k: int, run: np.ndarray) -> np.ndarray:
    """TensorRT-LLM's codes: ``rank_in_block + block + source`` (see :func:`dispatch_codes`).

    The kernel numbers the entries of a rank's ``[tokens, top_k]`` expert ids row-major;
    ``rank_in_block`` of an entry is how many earlier entries of its 1024-entry block name
    the same expert.  Entries of experts with one replica are left out of that count by
    the kernel, which cannot change a replicated expert's count.
    """
    flat = rank_position * top_k + k_position
    block = flat // TRTLLM_ROUTE_BLOCK
    if experts.size == 0:
        return flat
    num_experts = int(experts.max()) + 1
    span = int(flat.max()) + 1
    blocks = int(block.max()) + 1
    group = ((run - int(run.min())) * blocks + block) * num_experts + experts
    order = np.argsort(group * span + flat)
    grouped = group[order]
    starts = np.r_[True, grouped[1:] != grouped[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(order.size), 0))
    rank_in_block = np.empty_like(flat)
    rank_in_block[order] = np.arange(order.size) - first
    return rank_in_block + block + source


def choose_slots(
    policy: str,
    experts: np.ndarray,
    k_position: np.ndarray,
    source: np.ndarray,
    rank_position: np.ndarray,
    *,
    top_k: int,
    logical_to_physical: np.ndarray,
    replica_counts: np.ndarray,
    static_table: np.ndarray | None,
    rng: np.random.Generator | None,
    run: np.ndarray | None = None,
) -> np.ndarray:
    """Slot serving each selection of one layer.

    Parameters
    ----------
    experts: ``[n]`` int64 logical expert of each selection (all valid).
    k_position: ``[n]`` int64 index of the selection in its token's top-k list.
    source: ``[n]`` int64 source rank of the selection's token.
    rank_position: ``[n]`` int64 the token's position on its source rank in its batch.
    logical_to_physical: ``[E, X]`` this layer's slots per expert, -1 padded.
    replica_counts: ``[E]`` this layer's replicas per expert.
    static_table: ``[G, E]`` this layer's static table (``sglang`` and ``local_first``).
    rng: generator for the ``random`` policy.
    run: ``[n]`` int64 the (batch, source rank) forward pass of each selection
        (``trtllm_block``; see :func:`dispatch_codes`).

    Returns
    -------
    ``[n]`` int64 slot of each selection.
    """
    if policy in STATIC_POLICIES:
        if static_table is None:
            raise ValueError(f"the {policy} policy needs its static table")
        table_slots: np.ndarray = static_table[source, experts]
        return table_slots
    if policy not in CODE_POLICIES and policy != "random":
        raise ValueError(f"unknown policy {policy!r}")
    if policy == "random" and rng is None:
        raise ValueError("the random policy needs a generator")
    if int(replica_counts.max()) == 1:  # no replicas in this layer: nothing to choose
        return logical_to_physical[:, 0][experts]
    count = replica_counts[experts]
    if policy in CODE_POLICIES:
        replica = dispatch_codes(policy, experts, k_position, source, rank_position,
                                 top_k=top_k, run=run) % count
    else:
        assert rng is not None
        replica = np.minimum((rng.random(experts.size) * count).astype(np.int64), count - 1)
    width = logical_to_physical.shape[1]
    slots: np.ndarray = logical_to_physical.reshape(-1)[experts * width + replica]
    return slots


def random_generator(seed: int, layer_id: int) -> np.random.Generator:
    """The ``random`` policy's generator for one layer (reproducible per layer)."""
    return np.random.default_rng((seed, layer_id, _RANDOM_STREAM))


@dataclass(frozen=True)
class OrderBias:
    """Round-robin replicas whose use follows the k position of each top-k list.

    Attributes
    ----------
    experts: number of flagged (layer, expert) pairs.
    layers: number of layers with a flagged expert.
    layer_id: absolute id of the layer whose hot shard the bias moves most.
    hot_shard: that layer's hot-shard ratio (max / mean GPU load over all batches) as
        round robin served it.
    hot_shard_even: the same with the flagged experts' selections split evenly over
        their replicas (what a shuffled top-k list gives).
    expert: the most uneven flagged expert of that layer (logical id).
    replicas: its replica count.
    replica_ratio: the load of its busiest replica over an even share (``>= 1``).
    """

    experts: int
    layers: int
    layer_id: int
    hot_shard: float
    hot_shard_even: float
    expert: int
    replicas: int
    replica_ratio: float


def round_robin_order_bias(
    kpos_counts: np.ndarray,
    slot_load: np.ndarray,
    physical_to_logical: np.ndarray,
    num_gpus: int,
    layer_ids: np.ndarray,
) -> OrderBias | None:
    """Whether round-robin results hinge on the order of each token's top-k list.

    Round robin sends a selection at k position ``k`` of the ``j``-th token of a rank to
    replica ``(j * top_k + k) mod r``.  With ``d = gcd(r, top_k) > 1`` that replica is
    ``k mod d`` modulo ``d``: the k position alone picks the class of replicas
    ``{c, c + d, ...}``, and the rank position only spreads load within a class.  A
    shuffled top-k list puts an expert at every k position equally often, so each class
    gets ``1/d`` of the expert's selections; a list sorted by expert id or by score puts
    it at some positions more than others, and some replicas serve more than their share.

    An expert is flagged when its busiest class carries at least ``ORDER_BIAS_RATIO``
    times an even share, ``ORDER_BIAS_SIGMAS`` binomial standard deviations above it
    (what a shuffled list gives by chance).  The finding is reported when splitting the
    flagged experts' selections evenly over their replicas changes some layer's hot-shard
    ratio by at least ``ORDER_BIAS_MIN_EFFECT``.

    Parameters
    ----------
    kpos_counts: ``[layers, E, top_k]`` int64 selections of each expert at each k position
        over all evaluated batches.
    slot_load: ``[layers, P]`` float64 selections each slot served over all batches.
    physical_to_logical: ``[layers, P]`` int64 the placement's slot -> expert map.
    num_gpus: GPUs ``G`` (``P`` is a multiple of it, slots GPU-major).
    layer_ids: ``[layers]`` int64 absolute layer ids (for the message).

    Returns
    -------
    An :class:`OrderBias`, or None.  Cost: ``O(layers x (E x top_k + P))``.
    """
    kpos_counts = np.asarray(kpos_counts, dtype=np.int64)
    num_layers, num_experts, _ = kpos_counts.shape
    p2l = np.asarray(physical_to_logical, dtype=np.int64)
    replicas = np.stack([np.bincount(row, minlength=num_experts) for row in p2l]) \
        if num_layers else np.zeros((0, num_experts), dtype=np.int64)
    flagged, excess = _uneven_classes(kpos_counts, replicas)
    if not flagged.any():
        return None
    load = np.asarray(slot_load, dtype=np.float64)
    expert_total = kpos_counts.sum(axis=2).astype(np.float64)  # [L, E]
    rows = np.arange(num_layers)[:, None]
    even_slot = expert_total[rows, p2l] / replicas[rows, p2l]
    alt = np.where(flagged[rows, p2l], even_slot, load)
    actual_gpu = load.reshape(num_layers, num_gpus, -1).sum(axis=2)
    even_gpu = alt.reshape(num_layers, num_gpus, -1).sum(axis=2)
    mean = np.maximum(actual_gpu.mean(axis=1), 1e-12)
    hot = actual_gpu.max(axis=1) / mean
    hot_even = even_gpu.max(axis=1) / mean
    worst = int(np.argmax(np.abs(hot - hot_even)))
    if abs(hot[worst] - hot_even[worst]) < ORDER_BIAS_MIN_EFFECT:
        return None
    in_layer = np.where(flagged[worst], excess[worst], 0.0)
    top_expert = int(np.argmax(in_layer))
    return OrderBias(
        experts=int(flagged.sum()), layers=int(flagged.any(axis=1).sum()),
        layer_id=int(layer_ids[worst]), hot_shard=float(hot[worst]),
        hot_shard_even=float(hot_even[worst]), expert=top_expert,
        replicas=int(replicas[worst, top_expert]), replica_ratio=float(in_layer[top_expert]),
    )


def _uneven_classes(kpos_counts: np.ndarray,
                    replicas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([layers, E] bool, [layers, E] float64)``: the experts whose busiest replica class
    carries more than chance allows (see :func:`round_robin_order_bias`), and that class's
    load over an even share (1 where the k position cannot pick a class).

    ``kpos_counts``: ``[layers, E, top_k]`` int64; ``replicas``: ``[layers, E]`` counts.
    """
    num_layers, num_experts, top_k = kpos_counts.shape
    flagged = np.zeros((num_layers, num_experts), dtype=bool)
    excess = np.ones((num_layers, num_experts))
    for d in range(2, top_k + 1):
        if top_k % d:
            continue
        share = (np.gcd(replicas, top_k) == d) & (replicas > 1)
        if not share.any():
            continue
        layer, expert = np.nonzero(share)
        by_class = kpos_counts[layer, expert].reshape(-1, top_k // d, d).sum(axis=1)
        total = by_class.sum(axis=1).astype(np.float64)
        even = total / d
        top = by_class.max(axis=1).astype(np.float64)
        sigma = np.sqrt(total * (1.0 / d) * (1.0 - 1.0 / d))
        ratio = np.divide(top, even, out=np.ones_like(top), where=even > 0)
        noise = ORDER_BIAS_SIGMAS * np.maximum(sigma, 1.0)
        hit = (ratio >= ORDER_BIAS_RATIO) & (top - even >= noise)
        flagged[layer[hit], expert[hit]] = True
        excess[layer, expert] = ratio
    return flagged, excess


class OrderBiasWarning(PlacerWarning):
    """Round-robin results hinge on the order of top-k lists (:func:`round_robin_order_bias`).

    Attributes
    ----------
    bias: the finding.
    top_k: the routing's top-k.
    source: ``"trace"`` or ``"sampled"``.
    """

    def __init__(self, bias: OrderBias, top_k: int, source: str):
        self.bias = bias
        self.top_k = top_k
        self.source = source
        super().__init__(order_bias_message([("", bias)], top_k, source))


def order_bias_message(findings: list[tuple[str, OrderBias]], top_k: int, source: str) -> str:
    """The warning text for one or more :func:`round_robin_order_bias` findings.

    Parameters
    ----------
    findings: ``[(label, bias)]``; a label (``"eplb on fit"``) names the evaluation each
        finding comes from, ``""`` when there is only one.
    top_k: the routing's top-k.
    source: ``"trace"`` or ``"sampled"`` (where the order comes from).
    """
    origin = ("the sampled top-k lists are ordered hot experts first (docs/evaluate.md,"
              " Positions)" if source == "sampled" else
              "the trace lists each token's experts in a systematic order (by score or by"
              " expert id)")
    details = []
    for label, bias in findings:
        where = f"{label}: " if label else ""
        details.append(
            f"{where}{bias.experts} expert(s) in {bias.layers} layer(s); layer"
            f" {bias.layer_id}'s hot shard {bias.hot_shard:.3f}, {bias.hot_shard_even:.3f}"
            f" with those replicas used evenly (expert {bias.expert}, {bias.replicas}"
            f" replicas, busiest {bias.replica_ratio:.2f}x an even share)"
        )
    return (
        f"round_robin results depend on the order of each token's top-k list: replicated"
        f" experts whose replica count shares a factor with top_k={top_k} have the k"
        f" position alone pick among their replicas, and {origin}. "
        + "; ".join(details)
        + ". Compare with `policy` random, which ignores the order, or"
        " shuffle each token's top-k list; keep the order only if it is the one the"
        " engine's top-k kernel returns"
    )
