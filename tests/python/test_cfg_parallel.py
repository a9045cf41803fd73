"""CFG parallelism (ltx_kernels.cfg_parallel, issue 21 item 2) over 2 CPU ranks (gloo): the
tiny LTX-Video transformer with its CFG batch split over the ranks gives the one-process
output, stock and injected (either order), and so does a whole LTXPipeline denoise with
guidance; a batch that does not divide raises on every rank naming why; the hook is removed
cleanly. On 4 ranks, a (cfg 2) x (ulysses 2) mesh with diffusers' context parallelism gives
the one-process output too."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("diffusers")

WORLD = 2


def forward(model):
    from test_diffusers_ltx import step_kwargs

    kw = step_kwargs(model, "interpolation_scale", per_token=False)  # batch 2 (CFG)
    with torch.no_grad():
        return model(**kw)[0]


def denoise(model):
    from ltx_kernels.bench import ltx_models

    pipe = ltx_models.random_pipeline(model)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(**ltx_models.prompt_embeds(model, batch=1), num_frames=9, height=64, width=96,
                    num_inference_steps=2, guidance_scale=3.0, output_type="latent",
                    generator=torch.Generator().manual_seed(0)).frames


def model_of(order):
    import ltx_kernels.diffusers as lkd
    from ltx_kernels.cfg_parallel import enable_cfg_parallel
    from test_diffusers_ltx import tiny_model

    model = tiny_model("cpu", head_dim=12)
    if order == "inject_first":
        lkd.inject(model)
    if order != "one_process":
        enable_cfg_parallel(model)
    if order == "parallel_first":
        lkd.inject(model)
    return model


def rank_main(rank, store, order, run, out_path):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        model = model_of(order)
        batches = []  # what the model computes on each rank: half the CFG batch
        model.proj_in.register_forward_pre_hook(lambda module, args: batches.append(args[0].size(0)))
        out = run(model)
        assert batches and set(batches) == {1}, batches
        torch.save(out, f"{out_path}.{rank}")
        dist.barrier()  # both ranks done before either tears down
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("run", [forward, denoise])
@pytest.mark.parametrize("order", ["stock", "inject_first", "parallel_first"])
def test_cfg_parallel_matches_one_process(order, run, tmp_path):
    out_path = tmp_path / "out.pt"
    mp.spawn(rank_main, args=(tmp_path / "store", order, run, str(out_path)), nprocs=WORLD)
    expected = run(model_of("one_process") if order == "stock" else _injected())
    for rank in range(WORLD):  # every rank returns the whole batch's output
        out = torch.load(f"{out_path}.{rank}")
        assert out.shape == expected.shape
        # fp32; each rank runs a batch of 1 where one process runs 2: summation order only
        assert ((out - expected).norm() / expected.norm()).item() < 1e-5


def _injected():
    import ltx_kernels.diffusers as lkd

    model = model_of("one_process")
    lkd.inject(model)
    return model


def odd_batch_rank(rank, store):
    from test_diffusers_ltx import step_kwargs

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        model = model_of("stock")
        with torch.no_grad():
            model(**step_kwargs(model, "interpolation_scale", per_token=False, batch=3))
    finally:
        dist.destroy_process_group()


def test_a_batch_that_does_not_divide_raises(tmp_path):
    with pytest.raises(mp.ProcessRaisedException, match=r"batch of 3, which does not divide over 2 ranks"):
        mp.spawn(odd_batch_rank, args=(tmp_path / "store",), nprocs=WORLD)


def test_needs_torch_distributed_and_removes_cleanly(tmp_path):
    from ltx_kernels.cfg_parallel import disable_cfg_parallel, enable_cfg_parallel
    from test_diffusers_ltx import tiny_model

    model = tiny_model("cpu", head_dim=12)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="enable_cfg_parallel: torch.distributed must be initialized"):
            enable_cfg_parallel(model)
    assert not disable_cfg_parallel(model)
    expected = forward(model)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        enable_cfg_parallel(model)
        with pytest.raises(ValueError, match="already splits its batch"):
            enable_cfg_parallel(model)
        assert torch.equal(forward(model), expected)  # one rank: its share is the whole batch
        assert disable_cfg_parallel(model) and not disable_cfg_parallel(model)
        assert torch.equal(forward(model), expected)
    finally:
        dist.destroy_process_group()


def cfg_ulysses_rank(rank, store, out_path):
    """One of 4 ranks: a (cfg 2) x (ulysses 2) mesh; diffusers' context parallelism over the
    ulysses dim, ours over the cfg dim."""
    import diffusers
    import ltx_kernels.diffusers as lkd
    from ltx_kernels.cfg_parallel import enable_cfg_parallel
    from test_diffusers_ltx import step_kwargs, tiny_model

    torch.accelerator.device_count = lambda: 1  # diffusers' device pick (see test_context_parallel)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4)
    try:
        mesh = dist.device_mesh.init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("cfg", "ring", "ulysses"))
        model = tiny_model("cpu", head_dim=12)
        lkd.inject(model)
        model.enable_parallelism(config=diffusers.ContextParallelConfig(ulysses_degree=2, mesh=mesh))
        enable_cfg_parallel(model, group=mesh["cfg"].get_group())
        shapes = []  # each rank: half the CFG batch, half the tokens
        model.proj_in.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape[:2])))
        kw = step_kwargs(model, "video_coords", per_token=False, tokens=8)
        with torch.no_grad():  # 8 text tokens: the ulysses ranks shard them too
            out = model(**kw)[0]
        assert shapes == [(1, kw["hidden_states"].size(1) // 2)], shapes
        torch.save(out, f"{out_path}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_cfg_and_ulysses_on_a_2x2_mesh(tmp_path):
    """Issue 21's 4-GPU layout on 4 CPU ranks: every rank returns the one-process output."""
    import diffusers
    import ltx_kernels.diffusers as lkd

    if not hasattr(diffusers, "ContextParallelConfig"):  # an older diffusers (the pinned 0.42 has it)
        pytest.skip("this diffusers has no context parallelism")
    from test_diffusers_ltx import step_kwargs, tiny_model

    mp.spawn(cfg_ulysses_rank, args=(tmp_path / "store", str(tmp_path / "out.pt")), nprocs=4)
    model = tiny_model("cpu", head_dim=12)
    lkd.inject(model)
    with torch.no_grad():
        expected = model(**step_kwargs(model, "video_coords", per_token=False, tokens=8))[0]
    for rank in range(4):
        out = torch.load(f"{tmp_path / 'out.pt'}.{rank}")
        # the parallel run takes diffusers' fp32 RoPE tables, one process our fp64 angles
        assert ((out - expected).norm() / expected.norm()).item() < 1e-4
