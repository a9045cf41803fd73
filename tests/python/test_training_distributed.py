"""A patched model trained data-parallel, as trainers wrap it after ``apply()`` (issue 22 item 3):
DDP and FSDP2 (``fully_shard``) over 2 CPU ranks (gloo), each rank a half of the batch. Every
parameter's gradient, reduced over the ranks, must be the stock model's for the whole batch
(the mean of the halves' losses) computed in one process."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import rel_err

pytest.importorskip("transformers")
import ltx_kernels.transformers  # noqa: E402
from test_transformers_integration import prompt  # noqa: E402
from test_transformers_integration import tiny_model as tiny_llm  # noqa: E402

WORLD = 2


def half_loss(model, rank):
    """The causal-LM loss of batch row ``rank`` (the prompt's second row is left-padded)."""
    ids, mask = prompt()
    ids, mask = ids[rank:rank + 1], mask[rank:rank + 1]
    return model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss


def wrapped(model, how):
    if how == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # A CPU mesh named explicitly: FSDP2's default mesh is a CUDA one wherever a GPU is present,
    # which would move both ranks' shards onto one GPU under gloo (a rank segfaulted so on an H100).
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def rank_main(rank, store, how, out_path):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        model = tiny_llm("llama").train()
        ltx_kernels.transformers.apply(model)
        trained = wrapped(model, how)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            half_loss(trained, rank).backward()
        ran = {event.key for event in prof.key_averages() if event.key.startswith("ltx_kernels::")}
        grads = {"ran": ran}
        for name, p in model.named_parameters():
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # FSDP2: DTensor shards
            grads[name] = grad.detach().clone()
        if rank == 0:
            torch.save(grads, out_path)
        dist.barrier()  # both ranks done before either tears down
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("how", ["ddp", "fsdp2"])
def test_data_parallel_gradients_are_stock(how, tmp_path):
    out_path = tmp_path / "grads.pt"
    mp.spawn(rank_main, args=(tmp_path / "store", how, str(out_path)), nprocs=WORLD)
    grads = torch.load(out_path)
    # our kernels ran, forward and backward, under the wrapper (not the stock forwards)
    assert {"ltx_kernels::rms_norm", "ltx_kernels::rms_norm_backward", "ltx_kernels::silu_and_mul_backward",
            "ltx_kernels::apply_rotary_pos_emb_backward"} <= grads.pop("ran"), "our ops did not run"
    stock = tiny_llm("llama").train()
    ((half_loss(stock, 0) + half_loss(stock, 1)) / 2).backward()  # DDP and FSDP2 average over ranks
    names = [name for name, _ in stock.named_parameters()]
    assert sorted(grads) == sorted(names)
    for name, p in stock.named_parameters():
        assert rel_err(grads[name], p.grad) < 1e-4, (name, rel_err(grads[name], p.grad))


def test_patched_and_stock_models_have_the_same_parameter_names():
    """The comparison above matches gradients by name: apply() renames nothing."""
    stock = tiny_llm("llama")
    patched = copy.deepcopy(stock)
    ltx_kernels.transformers.apply(patched)
    assert [n for n, _ in stock.named_parameters()] == [n for n, _ in patched.named_parameters()]
