// common/decode_merge.wgsl without a fence after the count (`Caps::decode_merge_acquire` off:
// NVIDIA). The last workgroup's loads of the partials are coherent (L1-bypassing: LDG.E.STRONG.GPU)
// and issued only once the count's atomic has returned, as in the last block of CUDA's
// threadFenceReduction sample, which reads its partial sums with no fence after its atomic.

fn merge_acquire(last: bool) {}
