// The output of a subgroup's 16 rows on cooperative matrices: D / 16 accumulators of 16 x 16
// (named, as gemm_coop.wgsl's: arrays of cooperative matrices may live in slow memory), and
// their way through the subgroup's slice of workgroup memory. Shared by the cooperative
// attention kernels (flash_attention_coop.wgsl, attention_decode_coop.wgsl), which declare D
// (64 or 128), the f32 tile type TileC, and ss, an array<vec4<f32>> whose rows are SS4 vec4s.

var<private> o0: TileC;
var<private> o1: TileC;
var<private> o2: TileC;
var<private> o3: TileC;
var<private> o4: TileC;
var<private> o5: TileC;
var<private> o6: TileC;
var<private> o7: TileC;

// The accumulators into the subgroup's slice of ss from slice4 (16 x D, row-major) and back.
fn store_o(slice4: u32) {
    coopStoreT(o0, &ss[slice4], SS4);
    coopStoreT(o1, &ss[slice4 + 4u], SS4);
    coopStoreT(o2, &ss[slice4 + 8u], SS4);
    coopStoreT(o3, &ss[slice4 + 12u], SS4);
    if (D == 128u) {
        coopStoreT(o4, &ss[slice4 + 16u], SS4);
        coopStoreT(o5, &ss[slice4 + 20u], SS4);
        coopStoreT(o6, &ss[slice4 + 24u], SS4);
        coopStoreT(o7, &ss[slice4 + 28u], SS4);
    }
}

fn load_o(slice4: u32) {
    o0 = coopLoadT<TileC>(&ss[slice4], SS4);
    o1 = coopLoadT<TileC>(&ss[slice4 + 4u], SS4);
    o2 = coopLoadT<TileC>(&ss[slice4 + 8u], SS4);
    o3 = coopLoadT<TileC>(&ss[slice4 + 12u], SS4);
    if (D == 128u) {
        o4 = coopLoadT<TileC>(&ss[slice4 + 16u], SS4);
        o5 = coopLoadT<TileC>(&ss[slice4 + 20u], SS4);
        o6 = coopLoadT<TileC>(&ss[slice4 + 24u], SS4);
        o7 = coopLoadT<TileC>(&ss[slice4 + 28u], SS4);
    }
}

fn clear_o() {
    o0 = TileC();
    o1 = TileC();
    o2 = TileC();
    o3 = TileC();
    o4 = TileC();
    o5 = TileC();
    o6 = TileC();
    o7 = TileC();
}
