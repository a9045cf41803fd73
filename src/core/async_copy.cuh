// Asynchronous 16-byte global -> shared copies (cp.async, sm_80+). A thread issues copies,
// groups them with commit(), and waits with wait<n>() until at most n of its groups are
// still in flight. Each thread waits only for its own copies: a thread that reads back only
// what it copied needs no barrier.
#pragma once

namespace ltx_kernels::core {

__device__ __forceinline__ void async_copy16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  // .cg: cache in L2 only; the data is read once.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int PENDING>
__device__ __forceinline__ void async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

}  // namespace ltx_kernels::core
