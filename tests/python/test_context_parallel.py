"""diffusers' context parallelism over 2 CPU ranks (gloo) with an injected LTX-Video model
(issue 21, item 4's CPU test): Ulysses, inject before or after enable_parallelism, with the
stock attention backend or ours, gives the single-process output; ring attention with our
backend raises naming why. (Ring with diffusers' native backend cannot run on the CPU: it
needs the log-sum-exp, which diffusers' native attention does not return, stock as ours.)

diffusers places each rank on an accelerator (rank % device count): on a machine without
one the children report one device, which gloo and the CPU tensors ignore."""

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

diffusers = pytest.importorskip("diffusers")
if not hasattr(diffusers, "ContextParallelConfig"):
    pytest.skip("this diffusers has no context parallelism", allow_module_level=True)

WORLD = 2


def step(model):
    from test_diffusers_ltx import step_kwargs

    # 8 text tokens: diffusers shards them too, so they must divide by the ranks.
    kw = step_kwargs(model, "video_coords", per_token=False, tokens=8)
    with torch.no_grad():
        return model(**kw)[0]


def rank_main(rank, store, order, kind, attention, out_path):
    import ltx_kernels.diffusers as lkd
    from test_diffusers_ltx import tiny_model

    torch.accelerator.device_count = lambda: 1  # see the module docstring
    # A file store: no rank hosts a server that the other one still needs while tearing down.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        model = tiny_model("cpu", head_dim=12)
        config = diffusers.ContextParallelConfig(**{kind: WORLD})
        if order == "inject_first":
            lkd.inject(model, attention=attention)
        model.enable_parallelism(config=config)
        if order == "parallel_first":
            lkd.inject(model, attention=attention)
        out = step(model)
        if rank == 0:
            torch.save(out, out_path)
        dist.barrier()  # both ranks done before either tears down
    finally:
        dist.destroy_process_group()
    # Done: leave now, without the interpreter's own teardown, where a gloo worker thread can
    # still be destroyed with the process ("terminate called without an active exception",
    # SIGABRT, after the work and destroy_process_group had completed: twice in CI's runs of
    # these cases, with a TCP store and again with the file store and barrier; see torch's
    # pull 179291). An exception above still propagates to mp.spawn as usual.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def single_process(attention):
    import ltx_kernels.diffusers as lkd
    from test_diffusers_ltx import tiny_model

    model = tiny_model("cpu", head_dim=12)
    lkd.inject(model, attention=attention)
    return step(model)


@pytest.mark.parametrize("order", ["inject_first", "parallel_first"])
@pytest.mark.parametrize("attention", [None, "bf16"])
def test_ulysses_matches_one_process(order, attention, tmp_path):
    out_path = tmp_path / "out.pt"
    mp.spawn(rank_main, args=(tmp_path / "store", order, "ulysses_degree", attention, str(out_path)), nprocs=WORLD)
    out, expected = torch.load(out_path), single_process(attention)
    # fp32; the parallel run builds diffusers' RoPE tables (fp32 angles: its hooks shard
    # them), the single one our fp64 angles: ~1e-5 apart (as in test_diffusers_ltx).
    assert ((out - expected).norm() / expected.norm()).item() < 1e-4


def test_ring_with_our_backend_raises(tmp_path):
    with pytest.raises(mp.ProcessRaisedException, match="attention backend 'ltx_kernels': ring attention"):
        mp.spawn(rank_main, args=(tmp_path / "store", "inject_first", "ring_degree", "bf16", str(tmp_path / "o.pt")),
                 nprocs=WORLD)
