// common/decode_merge.wgsl's fence after the count: the last workgroup (`last`, uniform) acquires
// the other workgroups' partials, which each released before counting itself (the Vulkan memory
// model's pattern; `Caps::decode_merge_acquire`).

fn merge_acquire(last: bool) {
    if (last) { storageBarrier(); }
}
