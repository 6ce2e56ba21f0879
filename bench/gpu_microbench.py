"""GPU microbenchmark: expert GEMM and all-to-all times as a timings CSV for ``placer calibrate``.

    python bench/gpu_microbench.py -o timings.csv                        # one GPU: GEMMs
    torchrun --nproc-per-node 8 bench/gpu_microbench.py -o timings.csv   # + all-to-all
    placer calibrate timings.csv --topology dgx-h100 -o calibrated.yaml

- ``expert_gemm`` rows: one GPU runs ``--experts`` local experts' FFNs (gate/up
  ``hidden x 2 ffn``, SiLU, down ``ffn x hidden``; DeepSeek-V3 sizes by default) for each
  tokens-per-expert count: BF16 as batched matmuls, FP8 with ``torch._scaled_mm`` per
  expert where the GPU supports it; each replayed from a CUDA graph (no launch gaps).
- ``all_to_all`` rows (under ``torchrun`` with several ranks): NCCL
  ``all_to_all_single`` of one copy per (token, expert) selection, DeepEP-test-style
  routing drawn exactly as ``placer calibrate`` draws it
  (:class:`placer.calibrate.AllToAllCase`), so they are ``low_latency`` rows: FP8
  dispatch payload, BF16 combine, selections served locally sent nowhere.  The time is
  the slowest rank's median.

Needs torch with CUDA (``pip install -e '.[torch]'``).  Without either it prints one
line saying what is missing and exits 0, so ``make bench`` can call it anywhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from placer.calibrate.cases import AllToAllCase
from placer.calibrate.timings import AllToAllTiming, GemmTiming, Timing, write_timings

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "out" / "gpu_timings.csv"
HOW = ("on a machine with a CUDA GPU: pip install -e '.[torch]' && python"
       " bench/gpu_microbench.py -o timings.csv (under torchrun --nproc-per-node N it adds"
       " all-to-all rows)")


def missing() -> str | None:
    """What this machine lacks to run the benchmark, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    return None


def skip_message(what: str) -> str:
    return f"gpu_microbench: skipped: {what}; {HOW}"


def placer_gpu_name(device: str) -> str:
    """placer's GPU type for a CUDA device name (``NVIDIA H800`` -> ``h800-sxm``), as the
    ``# gpu:`` line that ``placer calibrate`` checks against the topology's GPUs; the
    device name itself, lower case with dashes, when no preset GPU type matches.

    >>> placer_gpu_name("NVIDIA H800"), placer_gpu_name("NVIDIA GB200")
    ('h800-sxm', 'gb200')
    """
    from placer.topology import load_topology, preset_names

    names = {t.name for p in preset_names() for t in load_topology(p).gpu_type_of_gpu}
    words = device.lower().replace("nvidia", " ").replace("amd", " ").split()
    # the longest model word first: gb200 before b200
    for name in sorted(names, key=lambda n: -len(n.split("-")[0])):
        if name.split("-")[0] in words or name in words:
            return name
    return "-".join(device.lower().split())


# -- pieces that need no GPU ------------------------------------------------------------


def selection_counts(case: AllToAllCase) -> np.ndarray:
    """``[G, G]`` selections rank g sends to rank h (one copy each, diagonal 0): the
    ``low_latency`` copies of ``case``."""
    ids = case.topk_ids().astype(np.int64)
    source = np.repeat(np.arange(case.num_gpus), case.tokens_per_gpu)
    dest = ids // (case.num_experts // case.num_gpus)
    counts = np.zeros((case.num_gpus, case.num_gpus), dtype=np.int64)
    np.add.at(counts, (np.repeat(source, case.top_k), dest.ravel()), 1)
    np.fill_diagonal(counts, 0)
    return counts


def gemm_timing(experts: int, tokens: int, hidden: int, ffn: int, dtype: str,
                measured_us: float, how: str) -> GemmTiming:
    return GemmTiming(experts, tokens, hidden, ffn, dtype, round(measured_us, 3),
                      note=f"gpu_microbench {how}")


# -- measuring --------------------------------------------------------------------------


def time_us(fn: Callable[[], Any], iters: int = 20, warmup: int = 3) -> float:
    """Median CUDA-event time of ``fn()``, microseconds."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` captured in a CUDA graph (replayed without launch gaps), or ``fn`` itself
    when capture fails."""
    import torch

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm up allocations outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay
    except RuntimeError:
        return fn


def expert_ffn(experts: int, tokens: int, hidden: int, ffn: int, dtype: str) -> Callable[[], Any]:
    """One GPU's FFN over ``experts`` experts of ``tokens`` tokens each."""
    import torch
    import torch.nn.functional as F

    bf16, dev = torch.bfloat16, "cuda"
    x = torch.randn(experts, tokens, hidden, device=dev, dtype=bf16)
    if dtype == "bf16":
        w13 = torch.randn(experts, hidden, 2 * ffn, device=dev, dtype=bf16) * 0.02
        w2 = torch.randn(experts, ffn, hidden, device=dev, dtype=bf16) * 0.02

        def run_bf16() -> Any:
            h = torch.bmm(x, w13)
            return torch.bmm(F.silu(h[..., :ffn]) * h[..., ffn:], w2)

        return run_bf16
    fp8 = torch.float8_e4m3fn
    xq = x.to(fp8)
    w13q = (torch.randn(experts, 2 * ffn, hidden, device=dev, dtype=bf16) * 0.02).to(fp8)
    w2q = (torch.randn(experts, hidden, ffn, device=dev, dtype=bf16) * 0.02).to(fp8)
    one = torch.ones((), device=dev, dtype=torch.float32)

    def run_fp8() -> Any:
        for e in range(experts):  # weights [N, K] row-major: .t() is the column-major B
            h = torch._scaled_mm(xq[e], w13q[e].t(), scale_a=one, scale_b=one, out_dtype=bf16)
            a = (F.silu(h[:, :ffn]) * h[:, ffn:]).to(fp8)
            torch._scaled_mm(a, w2q[e].t(), scale_a=one, scale_b=one, out_dtype=bf16)

    return run_fp8


def gemm_rows(experts: int, hidden: int, ffn: int, tokens: Sequence[int],
              dtypes: Sequence[str]) -> list[Timing]:
    import torch

    rows: list[Timing] = []
    for dtype in dtypes:
        for t in tokens:
            try:
                fn = expert_ffn(experts, t, hidden, ffn, dtype)
                us = time_us(graphed(fn))
            except (RuntimeError, AttributeError, TypeError) as exc:
                print(f"gpu_microbench: {dtype} GEMM with {t} tokens/expert not measured: "
                      f"{str(exc).splitlines()[0]}", file=sys.stderr)
                break
            finally:
                torch.cuda.empty_cache()
            how = "bmm" if dtype == "bf16" else "_scaled_mm per expert"
            rows.append(gemm_timing(experts, t, hidden, ffn, dtype, us, how))
            print(f"gpu_microbench: {rows[-1].label}: {us:.1f} us", file=sys.stderr)
    return rows


def all_to_all_rows(tokens: Sequence[int], hidden: int, top_k: int,
                    num_experts: int) -> list[Timing]:
    """NCCL all-to-all rows (every rank takes part; rank 0 gets the rows)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    rows: list[Timing] = []
    for t in tokens:
        case = AllToAllCase(world, per_node, t, hidden, top_k, num_experts, mode="low_latency")
        counts = selection_counts(case)
        for phase, row_bytes, matrix in (
            ("dispatch", case.model().activation_bytes(case.dtype), counts),
            ("combine", 2 * hidden, counts.T),
        ):
            send, recv = matrix[rank].tolist(), matrix[:, rank].tolist()
            out = torch.empty(sum(recv), row_bytes, dtype=torch.uint8, device="cuda")
            inp = torch.empty(sum(send), row_bytes, dtype=torch.uint8, device="cuda")

            def run(out: Any = out, inp: Any = inp, recv: list[int] = recv,
                    send: list[int] = send) -> None:
                dist.all_to_all_single(out, inp, recv, send)

            dist.barrier()
            slowest = torch.tensor([time_us(run)], device="cuda")
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            rows.append(AllToAllTiming(case, phase, round(float(slowest.item()), 3),
                                       note="gpu_microbench NCCL all_to_all_single"))
            if rank == 0:
                print(f"gpu_microbench: {rows[-1].label}: {rows[-1].measured_us:.1f} us",
                      file=sys.stderr)
    return rows


# -- entry points -----------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="CSV to write")
    p.add_argument("--experts", type=int, default=32, help="local experts (GEMM rows)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--ffn", type=int, default=2048, help="expert intermediate size")
    p.add_argument("--tokens-per-expert", type=_ints,
                   default=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--dtypes", default="bf16,fp8", help="GEMM weight dtypes")
    p.add_argument("--a2a-tokens", type=_ints, default=[128, 512, 2048],
                   help="tokens per rank of the all-to-all rows")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--num-experts", type=int, default=256, help="routed experts (all-to-all)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    lack = missing()
    if lack is not None:
        print(skip_message(lack))
        return 0
    import torch
    import torch.distributed as dist

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rows: list[Timing] = []
    if distributed:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
        rows += all_to_all_rows(args.a2a_tokens, args.hidden, args.top_k, args.num_experts)
    rank = dist.get_rank() if distributed else 0
    if rank == 0:
        dtypes = [d for d in args.dtypes.split(",") if d]
        rows += gemm_rows(args.experts, args.hidden, args.ffn, args.tokens_per_expert, dtypes)
        name = torch.cuda.get_device_name()
        write_timings(args.output, rows, [f"bench/gpu_microbench.py on {name}, torch"
                                          f" {torch.__version__}",
                                          f"gpu: {placer_gpu_name(name)}"])
        print(f"gpu_microbench: wrote {len(rows)} rows to {args.output}; next: placer calibrate"
              f" {args.output} --topology YOUR-TOPOLOGY -o calibrated.yaml")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def run() -> str:
    """``python -m bench gpu_microbench``: a Markdown block (the skip line without a GPU)."""
    lack = missing()
    if lack is not None:
        return f"## gpu_microbench\n\n{skip_message(lack)}\n"
    main([])
    return f"## gpu_microbench\n\nwrote {DEFAULT_OUTPUT}\n"


if __name__ == "__main__":
    sys.exit(main())
