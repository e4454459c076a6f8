"""DeepSpeed ZeRO-3's gathered parameters over one forward and backward pass, as its coordinator fetches them
(pure Python; :meth:`memlib.core.frameworks.deepspeed.DeepSpeed.working_set`).

``deepspeed/runtime/zero/partitioned_param_coordinator.py`` (DeepSpeed 0.19.8), ``PartitionedParameterCoordinator``:

- every module's pre-forward (pre-backward) hook calls ``fetch_sub_module``: the module's own parameters
  (``iter_params(..., recurse=False)`` below a leaf) are all-gathered in one coalesced call and waited on; then,
  once a trace of the modules is complete (from the second pass on), the next parameters of the trace are
  prefetched in one more coalesced call, up to ``prefetch_bucket_size`` elements (5·10⁷; the loop stops after the
  parameter that reaches it) and no further than ``max_live_parameters`` (10⁹) gathered in all
  (``max_params_to_prefetch = min(self.__max_n_available_params - self.__n_available_params, ...)``). Container
  modules have no parameters of their own but prefetch too;
- ``_all_gather_coalesced`` (``partition_parameters.py``) gathers into one flat buffer; the first ``wait`` copies
  every parameter of that call out of it (``param.data = torch.cat(partitions)...``) and the flat buffer stays
  referenced by ``__inflight_param_registry`` until the last of its parameters is popped, at that parameter's own
  fetch: until then a prefetched parameter is held twice. A call with one parameter goes to
  ``_all_gather_sequential`` instead, which gathers straight into the parameter's own buffer: held once;
- the post-forward (post-backward) hook's ``release_sub_module`` re-partitions the module's parameters except
  those used again within ``max_reuse_distance`` (10⁹ elements of the trace ahead, ``__params_to_release``);
- parameters under ``stage3_param_persistence_threshold`` (10⁵ elements) are never partitioned: every rank keeps
  them whole.

The module order is a decoder-only model's as transformers runs it (embedding, per layer the norms, q/k/v/o and
the MLP matrices, the final norm, the LM head; backward in reverse, and with full recomputation each layer's
forward again before its backward). A family this does not spell out (mixture of experts, latent attention)
counts each decoder layer as one module.
"""
from __future__ import annotations

from functools import lru_cache

from ..configs import ModelConfig

__all__ = ["PREFETCH_BUCKET", "MAX_LIVE_PARAMETERS", "MAX_REUSE_DISTANCE", "PERSISTENCE_THRESHOLD", "modules",
           "largest_module", "gathered_peak"]

#: ``stage3_prefetch_bucket_size`` default, elements (``deepspeed/runtime/zero/config.py``: ``pp_int(5e7)``).
PREFETCH_BUCKET = 50_000_000
#: ``stage3_max_live_parameters`` default, elements (``pp_int(1e9)``).
MAX_LIVE_PARAMETERS = 1_000_000_000
#: ``stage3_max_reuse_distance`` default, elements (``pp_int(1e9)``).
MAX_REUSE_DISTANCE = 1_000_000_000
#: ``stage3_param_persistence_threshold`` default, elements (``pp_int(1e5)``).
PERSISTENCE_THRESHOLD = 100_000

#: One module: (name, parameter ids and element counts, child modules).
Module = tuple[str, tuple[tuple[int, int], ...], tuple["Module", ...]]


def _layer(cfg: ModelConfig, i: int, layer_params: int, ids: list[int]) -> Module:
    h = cfg.hidden_size
    norm = h * (2 if cfg.norm == "layernorm" else 1)

    def leaf(name: str, *numels: int) -> Module:
        out = []
        for n in numels:
            ids[0] += 1
            out.append((ids[0], n))
        return (name, tuple(out), ())

    if cfg.moe is not None or cfg.mla is not None:
        return (f"layer{i}", (), (leaf("block", layer_params),))
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    b = cfg.qkv_bias
    attn = [leaf("q", h * q, *([q] if b else [])), leaf("k", h * kv, *([kv] if b else [])),
            leaf("v", h * kv, *([kv] if b else [])), leaf("o", q * h, *([h] if cfg.out_bias else []))]
    i_, mb = cfg.intermediate_size, cfg.mlp_bias
    mlp = [leaf("up", h * i_, *([i_] if mb else [])), leaf("down", i_ * h, *([h] if mb else []))]
    if cfg.mlp == "gated":
        mlp.insert(0, leaf("gate", h * i_, *([i_] if mb else [])))
    children = [leaf("norm_in", *[norm] * cfg.num_norms_in), ("attn", (), tuple(attn)), leaf("norm_mid", norm),
                ("mlp", (), tuple(mlp))]
    counted = sum(n for _, ps, ch in children for _, n in ps) + sum(
        n for _, ps, ch in children for _, p2, _c in ch for _, n in p2)
    if layer_params > counted:  # what this does not spell out (post-norms, q/k norms): one more leaf
        children.append(leaf("rest", layer_params - counted))
    return (f"layer{i}", (), tuple(children))


def modules(cfg: ModelConfig, layer_params: int) -> Module:
    """The model's module tree with its parameters' element counts (ids are the parameters' identities: a tied
    LM head shares the embedding's)."""
    h, ids = cfg.hidden_size, [0]
    embed = (1, cfg.vocab_size * h)
    ids[0] = 1
    top: list[Module] = [("embed", (embed,), ())]
    if cfg.learned_positions:
        ids[0] += 1
        top.append(("pos", ((ids[0], cfg.max_position_embeddings * h),), ()))
    top += [_layer(cfg, i, layer_params, ids) for i in range(cfg.num_layers)]
    ids[0] += 1
    top.append(("norm", ((ids[0], h * (2 if cfg.norm == "layernorm" else 1)),), ()))
    ids[0] += 1
    top.append(("lm_head", ((embed if cfg.tie_word_embeddings else (ids[0], cfg.vocab_size * h)),), ()))
    return ("model", (), tuple(top))


def largest_module(cfg: ModelConfig, layer_params: int) -> int:
    """The most elements one module holds directly (``parameters(recurse=False)``, as DeepSpeed's
    ``estimate_zero3_model_states_mem_needs`` counts in ``model_to_params``)."""

    def walk(m: Module) -> int:
        return max([sum(n for _, n in m[1]), *[walk(c) for c in m[2]]])

    return walk(modules(cfg, layer_params))


def _events(root: Module, recompute: bool) -> list[tuple[str, Module]]:
    """(``fetch`` | ``release``, module) in the order the hooks fire over one forward and backward pass."""

    def fwd(m: Module) -> list[tuple[str, Module]]:
        return [("fetch", m), *[e for c in m[2] for e in fwd(c)], ("release", m)]

    def bwd(m: Module) -> list[tuple[str, Module]]:
        again = fwd(m) if recompute and m[0].startswith("layer") else []
        return [("fetch", m), *again, *[e for c in reversed(m[2]) for e in bwd(c)], ("release", m)]

    return fwd(root) + bwd(root)


@lru_cache(maxsize=64)  # the planner asks for the same model many times
def gathered_peak(cfg: ModelConfig, layer_params: int, recompute: bool = False, *,
                  prefetch_bucket: int = PREFETCH_BUCKET, max_live: int = MAX_LIVE_PARAMETERS,
                  max_reuse: int = MAX_REUSE_DISTANCE, persistence_threshold: int = PERSISTENCE_THRESHOLD) -> int:
    """The most parameter elements gathered at once on a rank over a traced forward and backward pass: the
    per-parameter copies plus the flat buffers of coalesced gathers not yet fully consumed, plus the persistent
    parameters (whole on every rank). Multiply by the weight dtype's bytes."""
    events = _events(modules(cfg, layer_params), recompute)
    order = [m for kind, m in events if kind == "fetch"]  # the recorded trace (__submodule_order)
    numel = {pid: n for m in order for pid, n in m[1]}
    persist = {pid for pid, n in numel.items() if n < persistence_threshold}
    queue = [(pid, step) for step, m in enumerate(order) for pid, _ in sorted(set(m[1])) if pid not in persist]
    q_at = 0
    recent: dict[int, int] = {}
    avail: set[int] = set()  # per-parameter copies
    inflight: dict[int, int] = {}  # parameter -> coalesced gather id
    flats: dict[int, list[int]] = {}  # gather id -> [elements, members in the registry, waited]
    active: dict[int, int] = {}
    state = {"n_avail": 0, "live": 0, "peak": 0, "gid": 0}

    def gather(pids: list[int]) -> None:
        if not pids:
            return
        state["gid"] += 1
        size = sum(numel[p] for p in pids)
        single = len(pids) == 1  # _all_gather_sequential: into the parameter itself, no flat buffer to copy out of
        flats[state["gid"]] = [0 if single else size, len(pids), int(single)]
        for p in pids:
            inflight[p] = state["gid"]
            if single:
                avail.add(p)
        state["n_avail"] += size
        state["live"] += size
        state["peak"] = max(state["peak"], state["live"])

    def wait(p: int) -> None:
        gid = inflight.pop(p)
        flat = flats[gid]
        if not flat[2]:  # the first wait copies every parameter of the call out of the flat buffer
            flat[2] = 1
            for q in [q for q, g in inflight.items() if g == gid] + [p]:
                avail.add(q)
                state["live"] += numel[q]
            state["peak"] = max(state["peak"], state["live"])
        flat[1] -= 1
        if flat[1] == 0:
            state["live"] -= flat[0]
            del flats[gid]

    step = 0
    for kind, m in events:
        own = [pid for pid, _ in m[1] if pid not in persist]
        if kind == "release":
            keep = {p for p in own if recent.get(p, -1) > step}
            traversed = 0
            for later in order[step:]:
                if traversed >= max_reuse:
                    break
                for pid, n in later[1]:
                    keep.add(pid)
                    traversed += n
            for p in own:
                active[p] = active.get(p, 1) - 1
                if p not in keep and p in avail and active[p] <= 0 and p not in inflight:
                    avail.discard(p)
                    state["live"] -= numel[p]
                    state["n_avail"] -= numel[p]
            continue
        gather([p for p in dict.fromkeys(own) if p not in avail and p not in inflight])
        for p in dict.fromkeys(own):
            active[p] = active.get(p, 0) + 1
            if p in inflight:
                wait(p)
        fresh = [p for p in dict.fromkeys(own) if recent.get(p, -1) < step]
        for _ in fresh:  # the current module's entries leave the prefetch queue
            if q_at < len(queue):
                recent[queue[q_at][0]] = queue[q_at][1]
                q_at += 1
        budget, picked, size = min(max_live - state["n_avail"], prefetch_bucket), [], 0
        while q_at < len(queue) and size < budget:
            pid, used_at = queue[q_at]
            q_at += 1
            recent[pid] = max(recent.get(pid, -1), used_at)
            if pid not in avail and pid not in inflight and pid not in picked:
                picked.append(pid)
                size += numel[pid]
        gather(picked)
        step += 1
    return state["peak"] + sum(numel[p] for p in persist)
