"""Who is timed: one function per provider, each ``prepare(problem) -> Prepared``.

``Prepared.run`` (no arguments) enqueues the work and is what the GPU timer times;
``result`` returns the output (for the error against the reference); ``host_call`` is one
whole Python call as a user makes it (for the host cost). Whatever a provider does once per
shape (a plan, metadata, a gather for torch's contiguous cache) happens in ``prepare``.

Providers: every numba_mla kernel backend; torch (two ``bmm`` on a contiguous cache, and the
same after a gather from the pages); FlashMLA, FlashInfer and vLLM's Triton decode when they
are importable. FlashMLA is built outside the project and found through ``PYTHONPATH`` (see
docs/performance.md, "Peers"). A provider that cannot run raises ``Skip`` with the reason.
"""
import contextlib
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from .problems import D_QK, D_V

#: numba_mla kernel backends to time; one whose ``launch.Plan`` raises NotImplementedError (or
#: that has no kernel of its own yet) is skipped with the reason.
#: "warpsplit" is the simple kernel with ``decoding_warp_split_k`` (kernels/warpsplit.py),
#: "simt_warpsplit" the FMA kernel with it (kernels/simt.py, two groups of warps); the call
#: names the backend selector.WARP_SPLIT_ASKS gives.
#: "mma_sync_roles" and "mma_sync_lockstep" are "mma_sync" with its 32-row block's form chosen
#: either way (``FORMS``).
KERNEL_BACKENDS = ("simt", "mma", "mma_sync", "simple", "warpsplit", "simt_warpsplit",
                   "mma_sync_roles", "mma_sync_lockstep")


class Form(NamedTuple):
    """A provider that times one form of a backend's kernel: the backend it asks, the
    selector flag set to ``value`` while planning, and the kernel (KernelSpec.backend) the
    selector must then take, else the row is skipped."""
    asks: str
    flag: str
    value: bool
    kernel: str


FORMS = {"mma_sync_roles": Form("mma_sync", "MMA_SYNC_ROLES", True, "mma_sync_roles"),
         "mma_sync_lockstep": Form("mma_sync", "MMA_SYNC_ROLES", False, "mma_sync")}


class Skip(Exception):
    """A provider cannot run this configuration (or at all); the message says why."""


@dataclass
class Prepared:
    run: Callable[[], Any]                 # enqueues the work; this is what is timed
    result: Callable[[], Any]              # out [B, Sq, H, 512] after run (any array kind)
    host_call: Optional[Callable[[], Any]] = None  # one whole Python call, as a user makes it
    info: dict = field(default_factory=dict)       # extra row fields (resources, split)


# ---------------------------------------------------------------------------------------------
# numba_mla
# ---------------------------------------------------------------------------------------------
def schedule_of(spec):
    """Which split-K schedule a plan's kernel walks (docs/performance.md): "runs" (persistent
    blocks over runs of tiles that may cut sequences, heuristics.run_schedule), "whole runs"
    (whole sequences packed into the runs, heuristics.whole_runs: one partition), "mixed runs"
    (runs whose whole sequences write out themselves, heuristics.MIXED_RUNS), "listed"
    (each sequence cut as far as it needs, heuristics.list_blocks), or "balanced" (every
    sequence in P equal pieces; P = 1, one partition, writes out itself); None for a
    provider without a plan's kernel spec."""
    if spec is None or not hasattr(spec, "runs"):
        return None
    if spec.runs:
        return "whole runs" if spec.direct else "mixed runs" if spec.mixed else "runs"
    return "listed" if spec.work is not None else "balanced"


def numba_mla(p, backend):
    """A numba_mla kernel backend: ``check_decode`` + ``launch.Plan`` once, ``plan.launch()``
    timed; ``host_call`` is the prepared step (``numba_mla.prepare``) on device inputs, the
    whole ``numba_mla.mla_decode`` on NumPy ones."""
    import numba_mla as nm

    from .. import checks, launch, selector
    from ..selector import WARP_SPLIT_ASKS

    cfg = p.config

    split = backend in WARP_SPLIT_ASKS
    form = FORMS.get(backend)
    asks = form.asks if form else WARP_SPLIT_ASKS.get(backend, backend)

    @contextlib.contextmanager
    def flagged():
        if form is None:
            yield
            return
        before = getattr(selector, form.flag)
        setattr(selector, form.flag, form.value)
        try:
            yield
        finally:
            setattr(selector, form.flag, before)

    def plan_for():
        call = checks.check_decode(p.q, p.cache, p.scale, p.mask, None, cfg.num_partitions,
                                   True, None, asks)
        call.warp_split_k = split
        with flagged():
            return launch.Plan(call)

    try:
        plan = plan_for()
    except NotImplementedError as e:
        raise Skip(f"launch.Plan: {e}") from None
    except ValueError as e:  # "backend: 'mma' needs an sm_90 GPU ..." and the like
        if str(e).startswith("backend:"):
            raise Skip(f"launch.Plan: {e}") from None
        raise
    built = getattr(plan, "backend", None)
    if built is not None and built != (form.asks if form else backend):
        raise Skip(f"launch.Plan built backend {built!r} for backend={backend!r}")
    if form and (plan.spec.backend, plan.spec.block_m) != (form.kernel, 32):
        raise Skip(f"{backend}: the selector took {plan.spec.backend!r} with "
                   f"{plan.spec.block_m} rows a block here (the 32-row forms run past 16 "
                   f"query rows a sequence, 16-bit rows, where their block fits; the "
                   f"split-role form in four stages only, and not where its build uses "
                   f"local memory)")
    spec = getattr(plan, "spec", None)
    info = dict(num_partitions=plan.num_partitions, block_m=getattr(plan, "block_m", None),
                chunk=getattr(spec, "chunk", None),  # tiles a partition
                schedule=schedule_of(spec))
    if plan.launches:
        first = plan.launches[0]
        info["smem_bytes"] = int(first.smem)
        # the partition kernel's blocks (against the multiprocessors: the waves a schedule
        # takes, which the listed schedule's model prices: docs/performance.md)
        info["blocks"] = int(np.prod(first.grid))
        kern = getattr(first, "kernel", None)
        whole = getattr(first, "_whole", None)  # (a whole-program build: the one launched)
        for key, attr, whole_attr in (("registers", "regs_per_thread", "regs"),
                                      ("local_bytes", "local_mem_per_thread", "local_bytes")):
            try:
                info[key] = (int(getattr(whole, whole_attr)) if whole is not None
                             else int(getattr(kern, attr)) if kern is not None else None)
            except Exception:  # not every numba-cuda version has every attribute
                info[key] = None
    if split:  # only flare_mla_decoding takes it: no prepared step, the launches are timed
        info["host_path"] = None
        return Prepared(plan.launch, lambda: plan.result()[0], None, info)
    kw = dict(mask=p.mask, num_partitions=cfg.num_partitions, backend=asks)
    try:
        with flagged():
            host = nm.prepare(p.q, p.cache, p.scale, **kw)
        info["host_path"] = "numba_mla.prepare"
    except TypeError:  # NumPy inputs (the simulator): only the whole call takes them
        def host():
            with flagged():
                return nm.mla_decode(p.q, p.cache, p.scale, **kw)

        info["host_path"] = "numba_mla.mla_decode"
    return Prepared(plan.launch, lambda: plan.result()[0], host, info)


# ---------------------------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------------------------
def _torch_attend(p, bias):
    """softmax(scale q K^T + bias) V with two ``bmm`` (scores in the storage dtype, softmax in
    float32) over a contiguous [B, Lmax, 576] cache; the bias carries masks and lengths."""
    torch = p.device.torch
    B, sq, H, L = p.config.batch, p.config.sq, p.config.heads, p.max_len
    q2 = p.q.reshape(B, sq * H, D_QK)
    scale = p.scale

    def attend(kv):
        s = torch.bmm(q2, kv.transpose(1, 2)).float() * scale   # [B, Sq*H, L]
        if bias is not None:
            s = (s.view(B, sq, H, L) + bias).view(B, sq * H, L)
        pr = torch.softmax(s, dim=-1).to(kv.dtype)
        return torch.bmm(pr, kv[..., :D_V]).view(B, sq, H, D_V)

    return attend


def _torch_inputs(p):
    torch = p.device.torch
    idx = torch.as_tensor(p.token_index(), device="cuda")
    bias = p.keep_bias()
    return idx, None if bias is None else torch.as_tensor(bias, device="cuda")


def torch_bmm(p):
    """torch on a contiguous cache: the gather from pages is done once, before timing (the
    cost a real paged caller would pay is in ``torch_gather``)."""
    idx, bias = _torch_inputs(p)
    B, L = p.config.batch, p.max_len
    kv = p.pages.reshape(-1, D_QK).index_select(0, idx.view(-1)).view(B, L, D_QK)
    attend = _torch_attend(p, bias)
    state = {}

    def run():
        state["out"] = attend(kv)

    return Prepared(run, lambda: state["out"], run, dict(page_size=None))


def torch_gather(p):
    """torch from the paged cache: gather each sequence's rows (index_select), then two bmm."""
    idx, bias = _torch_inputs(p)
    B, L = p.config.batch, p.max_len
    flat_idx = idx.view(-1)
    pages = p.pages.reshape(-1, D_QK)
    attend = _torch_attend(p, bias)
    state = {}

    def run():
        state["out"] = attend(pages.index_select(0, flat_idx).view(B, L, D_QK))

    return Prepared(run, lambda: state["out"], run, {})


# ---------------------------------------------------------------------------------------------
# Peers, each run only when importable. A peer that raises is reported in meta["errors"] (no
# row) and does not fail the run; only numba_mla rows are validated.
# ---------------------------------------------------------------------------------------------
def _peer_checks(p, name, page_sizes=None):
    cfg = p.config
    if cfg.dtype not in ("bfloat16", "float16"):
        raise Skip(f"{name} takes bf16/fp16 only, not {cfg.dtype}")
    if cfg.mask not in ("null", "causal"):
        raise Skip(f"{name}: mask {cfg.mask!r} has no equivalent")
    if page_sizes and cfg.page_size not in page_sizes:
        raise Skip(f"{name} needs page size {page_sizes}, not {cfg.page_size}")


def flash_mla(p):
    """deepseek-ai/FlashMLA's dense decode: ``get_mla_metadata`` once per shape, then
    ``flash_mla_with_kvcache`` timed. Recent versions take no arguments there and schedule
    on their first call (then reuse it: the lengths do not change between runs); older ones
    take (lengths, Sq * H, 1) and return the split counts too, so both are passed on."""
    _peer_checks(p, "flash_mla", page_sizes=(64,))
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata

    cfg = p.config
    k = p.pages.unsqueeze(2)  # [P, 64, 1, 576]: one KV head
    meta, splits = get_mla_metadata(p.lengths, cfg.sq * cfg.heads, 1)
    causal = cfg.mask == "causal"
    state = {}

    def run():
        state["out"] = flash_mla_with_kvcache(p.q, k, p.block_table, p.lengths, D_V, meta,
                                              splits, softmax_scale=p.scale, causal=causal)[0]

    return Prepared(run, lambda: state["out"], run, {})


def flashinfer(p):
    """flashinfer.mla.BatchMLAPagedAttentionWrapper: ``plan`` once, ``run`` timed (latent and
    rope parts of cache and q split into separate contiguous tensors beforehand). Not yet run
    where this was written (not installed there)."""
    _peer_checks(p, "flashinfer")
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    torch = p.device.torch
    cfg = p.config
    B, sq, H = cfg.batch, cfg.sq, cfg.heads
    used = -(-p.lengths_host.astype(np.int64) // cfg.page_size)
    indices = np.concatenate([p.block_table_host[b, :used[b]] for b in range(B)])
    dev = dict(device="cuda", dtype=torch.int32)
    qo_indptr = torch.arange(B + 1, **dev) * sq
    kv_indptr = torch.as_tensor(np.concatenate([[0], np.cumsum(used)]).astype(np.int32),
                                device="cuda")
    kv_indices = torch.as_tensor(indices.astype(np.int32), device="cuda")
    ws = torch.empty(128 << 20, dtype=torch.int8, device="cuda")
    wrapper = BatchMLAPagedAttentionWrapper(ws, backend="auto")
    dt = p.q.dtype
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, p.lengths, H, D_V, D_QK - D_V,
                 cfg.page_size, cfg.mask == "causal", p.scale, dt, dt)
    ckv = p.pages[..., :D_V].contiguous()
    kpe = p.pages[..., D_V:].contiguous()
    q3 = p.q.reshape(B * sq, H, D_QK)
    q_nope, q_pe = q3[..., :D_V].contiguous(), q3[..., D_V:].contiguous()
    state = {}

    def run():
        state["out"] = wrapper.run(q_nope, q_pe, ckv, kpe).view(B, sq, H, D_V)

    return Prepared(run, lambda: state["out"], run, {})


VLLM_MODULES = ("vllm.v1.attention.ops.triton_decode_attention",
                "vllm.attention.ops.triton_decode_attention")


def vllm_triton(p):
    """vLLM's Triton MLA decode (``decode_attention_fwd``, paged); one query token per
    sequence; ``num_kv_splits`` = Config.num_partitions or 8."""
    import importlib

    _peer_checks(p, "vllm_triton")
    cfg = p.config
    if cfg.sq != 1:
        raise Skip("vllm_triton decodes one query token per sequence")
    fn = None
    for m in VLLM_MODULES:
        try:
            fn = importlib.import_module(m).decode_attention_fwd
            break
        except ImportError:
            continue
    torch = p.device.torch
    B, H = cfg.batch, cfg.heads
    splits = cfg.num_partitions or 8
    k_buf = p.pages.unsqueeze(2)                  # [P, page, 1, 576]
    v_buf = k_buf[..., :D_V]                      # [P, page, 1, 512]
    q3 = p.q.reshape(B, H, D_QK)
    o = torch.empty((B, H, D_V), dtype=q3.dtype, device="cuda")
    lse = torch.empty((B, H), dtype=torch.float32, device="cuda")
    logits = torch.empty((B, H, splits, D_V + 1), dtype=torch.float32, device="cuda")
    with_lse = "lse" in inspect.signature(fn).parameters
    head = (q3, k_buf, v_buf, o) + ((lse,) if with_lse else ())

    def run():
        fn(*head, p.block_table, p.lengths, logits, splits, p.scale, cfg.page_size)

    return Prepared(run, lambda: o.view(B, 1, H, D_V), run, dict(num_partitions=splits))


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------
def _import_reason(*modules):
    """None when one of ``modules`` imports, else why none does."""
    reasons = []
    for m in modules:
        try:
            __import__(m)
            return None
        except Exception as e:  # ImportError, or a broken install
            reasons.append(f"{m} is not importable ({type(e).__name__}: {e})")
    return "; ".join(reasons)


def _needs_torch(dev):
    return None if dev.torch is not None else dev.torch_reason


def _needs(*modules):
    def unavailable(dev):
        return _needs_torch(dev) or _import_reason(*modules)
    return unavailable


@dataclass(frozen=True)
class Provider:
    """A provider: ``prepare(problem) -> Prepared``; ``splits``: honours
    Config.num_partitions (others are not run when it is set); ``unavailable(device)``: None
    when it can run there, else the reason."""

    name: str
    prepare: Callable[[Any], Prepared]
    backend: Optional[str] = None
    splits: bool = False
    unavailable: Callable[[Any], Optional[str]] = lambda dev: None

    @property
    def key(self):
        return self.name if self.backend is None else f"{self.name}:{self.backend}"


def all_providers():
    return [Provider("numba_mla", functools.partial(numba_mla, backend=b), b, splits=True)
            for b in KERNEL_BACKENDS] + [
        Provider("torch_bmm", torch_bmm, unavailable=_needs_torch),
        Provider("torch_gather", torch_gather, unavailable=_needs_torch),
        Provider("flash_mla", flash_mla, unavailable=_needs("flash_mla")),
        Provider("flashinfer", flashinfer, unavailable=_needs("flashinfer")),
        Provider("vllm_triton", vllm_triton, splits=True, unavailable=_needs(*VLLM_MODULES))]


def select_providers(spec=None):
    """Providers from a comma-separated list of names (``numba_mla`` = every kernel backend,
    ``numba_mla:simt`` one); None = all."""
    provs = all_providers()
    if not spec:
        return provs
    want = [s.strip() for s in spec.split(",") if s.strip()]
    names = {p.name for p in provs} | {p.key for p in provs}
    bad = [w for w in want if w not in names]
    if bad:
        raise ValueError(f"providers: unknown {bad}; expected names from {sorted(names)}")
    return [p for p in provs if p.name in want or p.key in want]
