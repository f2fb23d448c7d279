// The step kiln's split decode attention takes after writing a split's partial rows
// (common/decode_merge.wgsl's merge_ticket): a device-scope fence, then the block counts itself
// done on done[h], the last of a head's S resetting the count for the next launch. Returns the
// block's ticket to every thread: S - 1 for the last, which merges. Shared by the CUDA labs that
// rebuild that grid (merge_lab.cu, split_lab.cu, icache_lab.cu); each still builds alone with
// `nvcc -O3 -arch=sm_90 -o LAB LAB.cu` from this directory.
#pragma once

__device__ __forceinline__ unsigned count_split_done(unsigned* done, int h, int S) {
    __shared__ unsigned ticket;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned t = atomicAdd(&done[h], 1u);
        if (t + 1 == S) done[h] = 0;
        ticket = t;
    }
    __syncthreads();
    return ticket;
}
