"""Numeric constants used across placer, in one place, each with its unit."""

#: Bytes in one GB as placer uses it (1e9, as vendors quote bandwidth and memory).
GB = 1_000_000_000

#: Epsilon of SGLang's balancedness metric: mean over layers of (mean + eps) / (max + eps).
SGLANG_BALANCEDNESS_EPS = 1e-5

#: Most windows an ExpertStats keeps; more are merged pairwise while streaming.
MAX_WINDOWS = 64

#: (token, layer) rows per chunk when streaming per-token traces (NPZ): large chunks let
#: each layer's pair counts (E^2 x 8 bytes) come into cache once for many tokens.
CHUNK_ROWS = 1 << 19

#: A plan replaces the reference EPLB only when the evaluator estimates its step on the
#: fitted windows at least this share faster: smaller gains are within the noise of
#: sampled batches and of held-out routing, and EPLB is what users run and trust.
JUDGE_MARGIN = 0.005

#: Largest integer CP-SAT coefficients should reach after scaling loads.
CPSAT_LOAD_SCALE_MAX = 1_000_000

#: Largest random seed: CP-SAT's ``random_seed`` is a signed 32-bit integer.
MAX_SEED = (1 << 31) - 1

#: Resolution of pictures embedded in HTML reports and written with --png-dir, dots per inch.
REPORT_DPI = 100

#: Range --dpi accepts, dots per inch.
REPORT_DPI_RANGE = (20, 400)

#: Pictures wider than this (inches) are stacked in the report instead of side by side.
REPORT_SIDE_BY_SIDE_MAX_IN = 8.0

#: Placement maps write each slot's expert id in its cell up to this many slots per layer.
PLACEMENT_MAP_MAX_LABELS = 320

#: Most layers drawn as panels of the per-GPU load bar chart.
GPU_LOAD_MAX_PANELS = 6

#: Share of routing windows a comparison holds out for evaluation (the rest is fitted).
HOLDOUT_FRACTION = 0.25

# -- hardware and model sizes (placer.topology, placer.model, placer.model.capacity) -----------

#: Expert dtypes placer sizes, in the order ``placer capacity`` tries smaller ones.
DTYPES = ("bf16", "fp8", "mxfp4")

#: Bytes per weight element of each dtype, scales excluded.
BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "mxfp4": 0.5}

#: FP8 weights carry one float32 scale per 128 x 128 block (DeepSeek-V3 ``weight_scale_inv``,
#: Qwen3 FP8 checkpoints): ``ceil(rows / 128) * ceil(cols / 128) * 4`` bytes per matrix.
FP8_WEIGHT_BLOCK = 128
FP8_SCALE_BYTES = 4

#: MXFP4 (OCP microscaling): 4-bit elements and one 8-bit E8M0 scale per 32 elements along
#: the reduction axis, i.e. 4.25 bits per parameter (gpt-oss checkpoints).
MXFP4_BLOCK = 32
MXFP4_SCALE_BYTES = 1

#: FP8 dispatch (DeepEP): one float32 scale per 128 activations, so a token copy is
#: ``hidden + hidden / 32`` bytes.
FP8_ACTIVATION_GROUP = 128

#: Bytes per parameter of weights that stay BF16 whatever the expert dtype (embeddings,
#: norms, routers, biases), and per hidden value the combine phase returns.
BF16_BYTES = 2

#: Runtime memory per GPU that is neither weights nor KV cache, GB: CUDA context and
#: cuBLAS workspaces (~1 GB), DeepEP/NCCL all-to-all buffers (~2 GB), activations and CUDA
#: graphs (~1 GB).  A planning assumption, not a measurement: override with --overhead-gb.
RUNTIME_OVERHEAD_GB = 4.0

#: Part of each GPU's memory kept for the KV cache when neither --kv-reserve-gb nor
#: --kv-reserve-fraction is given (20 GB on an 80 GB H100).
DEFAULT_KV_RESERVE_FRACTION = 0.25

#: One-way GPU-to-GPU latency of a fabric when a topology file does not give one,
#: microseconds (small-message figures; the evaluator adds them per message).
DEFAULT_FABRIC_LATENCY_US = {"nvswitch": 1.0, "switch": 1.0, "mesh": 1.0, "pcie": 2.0, "none": 0.0}

#: NIC-to-NIC latency of the network between nodes when not given, microseconds.
DEFAULT_NETWORK_LATENCY_US = 2.0

# -- statistics and synthetic traces (placer.stats.analysis, placer.traces.synth) -----------

#: Hot set compared between windows for drift: this share of a layer's experts (rounded up).
DRIFT_HOT_SET_FRACTION = 0.125

#: Co-activation counts covering less than this share of (top_k - 1) x load are "partial".
COACT_COVERAGE_WARN = 0.99

#: Tokens generated per chunk by placer.traces.synth (memory: about 40 bytes x experts x chunk).
SYNTH_CHUNK_TOKENS = 1 << 15

#: Experts ids a synthetic trace supports (int16 ids); top-k up to this many experts.
SYNTH_MAX_EXPERTS = 4096
SYNTH_MAX_TOP_K = 64

# -- trace ingestion (placer.traces) ----------------------------------------------------

#: Most experts per layer placer reads (ids must fit int16 in per-token arrays).
MAX_EXPERTS = 32768

#: Largest absolute layer id a trace may name.
MAX_LAYER_ID = 1_048_575

#: This many identical consecutive routing rows of one layer look like a profiling or
#: warm-up pass (dummy tokens) and raise a TraceWarning.
WARMUP_RUN_ROWS = 64


#: Inputs at least this large (bytes, all files together) show a progress bar with
#: progress=True.
PROGRESS_MIN_BYTES = 64 << 20

# -- input limits: what a reader accepts before it allocates (docs/limits.md) -----------

#: Experts one routing row may list (its width, -1 padding included): real models
#: select 1 to 16; co-activation costs top_k^2 per token.
MAX_TOP_K = 256

#: Distinct MoE layers of a trace or statistics file, and hidden layers of a model
#: (the largest models have about 100).
MAX_LAYERS = 4096

#: Bytes of one line of a JSONL trace or CSV file; a longer line (or a file without
#: newlines, such as /dev/zero) is refused.
MAX_LINE_BYTES = 1 << 20

#: Bytes of the load statistics ``[windows, layers, experts]`` int64 a read may build.
MAX_LOAD_BYTES = 256 << 20

#: Bytes of dense co-activation and layer-affinity counts (``[layers, E, E]`` int64).  A
#: per-token read counts pairs in dense matrices while they fit (the fast way), then in
#: sparse pair lists whose memory follows the distinct pairs seen (MAX_COACT_PAIRS).  A
#: figure that needs a dense ``[E, E]`` matrix (the sampler, the static evaluator, the
#: report's heat map) builds it up to this size, and an aggregated file's coact fits it.
MAX_COACT_BYTES = 256 << 20

#: Distinct expert pairs (co-activation and layer affinity together, 16 bytes each) a
#: per-token read counts sparsely (while counting it may hold twice as many, repeats from
#: different chunks not yet merged); past it co-activation is left out with a warning
#: (``coact=False``), the load is still read.
MAX_COACT_PAIRS = 1 << 24

#: Largest sum of the counts of one aggregated input ((token, expert) selections): 2^53
#: keeps every total exact in int64 and float64.
MAX_TOTAL_COUNT = 1 << 53

#: Bytes of a file read whole (YAML and JSON documents, CSV files, safetensors, the
#: pickle of a .pt file): they are small hand-written or engine-written files.
MAX_DOCUMENT_BYTES = 64 << 20

#: Nesting depth of a JSON or YAML document (lists and mappings inside each other).
MAX_NESTING = 100

#: Values of a YAML document with its aliases expanded ("billion laughs" stop here).
MAX_YAML_NODES = 1 << 20

#: A compressed input (gzip trace, zip member of .npz or .pt) may decompress to this
#: many bytes freely; past it, to at most MAX_DECOMPRESSION_RATIO times its compressed
#: size (deflate gives ~1000x only on degenerate data such as zeros or blank lines).
DECOMPRESSION_FREE_BYTES = 64 << 20
MAX_DECOMPRESSION_RATIO = 200

#: A gzip trace is read as a stream, in bounded memory whatever it inflates to: what is
#: limited is the bytes it inflates to (and so the time reading takes), not the ratio.
MAX_INFLATED_BYTES = 16 << 30

#: Bytes a .pt tensor may take beyond its storage (a stride-0 tensor repeats elements).
MAX_PT_EXPANDED_BYTES = 64 << 20

#: GPUs of a topology (its [GPUs, GPUs] link matrices take 16 bytes a pair).
MAX_GPUS = 16384

#: Largest hidden size or expert FFN size of a model or timing row (largest real: ~20k).
MAX_MODEL_DIM = 1 << 20

#: Largest parameter count of a model's non-expert weights (1.1e15).
MAX_MODEL_PARAMS = 1 << 50

#: Tokens of one calibration case (num_gpus x tokens_per_gpu), routed in memory.
MAX_CALIBRATE_TOKENS = 1 << 22

# -- the CP-SAT planner (placer.planning.solvers.cpsat) -------------------------------------

#: Slots a large-neighbourhood sub-model frees at once (GPUs freed = this / S, at least 2).
CPSAT_NEIGHBOURHOOD_SLOTS = 10

#: Sub-models per layer for the balance pass and for the traffic/migration pass.
CPSAT_BALANCE_ITERATIONS = 30
CPSAT_COST_ITERATIONS = 20

#: A pass stops after this many sub-models in a row that did not improve it ...
CPSAT_PATIENCE = 10
#: ... except the traffic/migration pass, which stops after this many (6: on gpt-oss-20b
#: 4 x 9 under half the wall time of 10, for 0.2% more remote copies per token).
CPSAT_COST_PATIENCE = 6

#: Deterministic-time limit of one sub-model (CP-SAT's "deterministic seconds").
CPSAT_SUBMODEL_DTIME = 0.05

#: Largest full model solved in one piece (z variables: experts x GPUs x replica counts).
CPSAT_FULL_MODEL_MAX_VARS = 600

#: Deterministic-time limit of a full model (one per pass).
CPSAT_FULL_MODEL_DTIME = 0.5

#: Relative gap to the balance lower bound at which the balance pass stops.
CPSAT_BALANCE_GAP = 5e-4

#: Co-activation pairs kept: the heaviest pairs carrying this share of the pair mass ...
CPSAT_PAIR_MASS = 0.95
#: ... and at most this many pairs per expert of the layer.
CPSAT_PAIRS_PER_EXPERT = 8
#: ``robust="cvar"``: objective 1 averages the hot shards of this share of the windows,
#: the worst ones (the conditional value at risk at level 1 - fraction).
CPSAT_CVAR_FRACTION = 0.25
#: Most windows a layer's CP-SAT model holds: past it the fitted windows are merged,
#: consecutive ones summed, into this many (a step's model, and the time CP-SAT spends
#: loading and presolving it, grow with its windows: 62 windows of a 1,000,000-token trace
#: cost 30 ms a step beyond the search, 16 windows 15 ms).  Every bench plan but the
#: longest traces' fits 32 or fewer, and is unchanged by the cap.
CPSAT_MAX_WINDOWS = 32
#: With a batch size to plan for, each GPU's load counts this many standard deviations
#: of its per-batch noise (about the 98th percentile of one GPU's load).
CPSAT_NOISE_Z = 2.0

#: Cost of a copy across nodes relative to one inside a node when no topology gives
#: bandwidths (DeepSeek-V3: 160 GB/s NVLink vs 50 GB/s InfiniBand per GPU).
CPSAT_INTER_NODE_COST = 3.0

#: Integer scale of the traffic/migration objective's coefficients.
CPSAT_COST_SCALE = 1_000_000

#: Worst-case rounding error of a GPU's scaled load, relative to the mean GPU load,
#: above which a ScalingWarning is raised.
CPSAT_SCALING_RTOL = 1e-4

#: Sampled batches, and tokens per batch, behind ``placer plan``'s side-by-side remote
#: copies for top-k > 2 (where the evaluator's closed form is only a pairwise bound).
PLAN_VERSUS_BATCHES = 16
PLAN_VERSUS_BATCH_TOKENS = 2048

# -- evaluator (placer.evaluate) -------------------------------------------------------------

#: Tokens per batch the evaluator uses when the trace has no steps and --batch-tokens is
#: not given: 128 decode tokens on each of 32 attention data-parallel ranks.
DEFAULT_BATCH_TOKENS = 4096

#: Batches the evaluator samples from aggregated statistics when --num-batches is not given.
DEFAULT_SAMPLED_BATCHES = 16

#: Flops of one token through one expert FFN per (hidden x ffn): three matrices (gate, up,
#: down), two flops per multiply-add.
EXPERT_FFN_FLOPS_FACTOR = 6


# -- evaluator sampling (placer.evaluate.sampling) ------------------------------------------

#: Random expert orderings (systematic-sampling rows) per window and layer when sampling
#: top-k sets from aggregated statistics; with co-activation, each anchor expert gets
#: ``max(1, SAMPLING_ORDERINGS // experts)`` of them.
SAMPLING_ORDERINGS = 128

#: Most fixed-point rounds calibrating the co-activation mixture to the window's load.
SAMPLING_CALIBRATION_ROUNDS = 30

#: Calibration stops once every expert's inclusion probability is this close (absolute)
#: to its target; what is left is corrected by mixing in plain systematic sampling.
SAMPLING_CALIBRATION_TOL = 1e-4

#: Default weight of the moved fraction of slots against traffic in the planner's second
#: pass (``--migration-weight``).  3.0 measured on the Mixtral re-plan benchmark (4 GPUs x
#: 3 slots): 0.51 of a fresh plan's moves at weight 1, 0.49 at 3, 0.49 at 10, with the
#: same hot shard; traffic is only traded against moves when ``--current`` is given.
DEFAULT_MIGRATION_WEIGHT = 3.0

#: Re-planning without a move budget: the fewest moves whose estimated time is within this
#: share of the best re-plan's (``--move-tolerance``; ``placer.placement.migration.Frontier``).
MOVE_TOLERANCE = 0.005

#: Budgets (shares of the best re-plan's moves) the move frontier is reported at.
FRONTIER_SHARES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)

#: Wall seconds for a whole plan by default (``--time-limit``, ``SolveParams.total_time_limit_s``):
#: 70% goes to the layer search, split over the layers (each at most ``--layer-time-limit``),
#: so a DeepSeek-V3-size plan, summary included, finishes within 30 s on 2 cores
#: (docs/performance.md, "Plans at scale"); small plans stop earlier.
DEFAULT_PLAN_SECONDS = 18.0
