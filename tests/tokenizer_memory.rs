//! Tokenizers built and dropped one after another leave nothing behind (found by fuzzing:
//! the `tokenizers` crate's per-thread BPE word cache keeps the entries of every BPE model
//! ever used on a thread, so a process that loads vocabularies repeatedly grew without bound).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use common::testdata;
use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;

/// Live heap bytes of the whole process.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn building_and_dropping_tokenizers_does_not_grow_the_heap() {
    // Distinct words, so that a per-model word cache would hold each of them.
    let text: String = (0..3000).map(|i| format!("w{i}x{} ", i * 7919 % 1000)).collect();
    for name in ["ggml-vocab-gpt-2", "ggml-vocab-llama-spm"] {
        let file = GgufFile::open(testdata().join(format!("vocab/{name}.gguf"))).unwrap();
        let mut after_first = 0;
        for round in 0..8 {
            let tok = Tokenizer::from_gguf(&file).unwrap();
            let ids = tok.encode(&text, false).unwrap();
            assert!(ids.len() > 3000);
            drop(tok);
            let live = LIVE.load(Ordering::Relaxed);
            if round == 0 {
                after_first = live;
            }
            eprintln!("{name} round {round}: live heap {:.2} MiB", live as f64 / (1 << 20) as f64);
        }
        let growth = LIVE.load(Ordering::Relaxed) - after_first;
        assert!(growth < 256 << 10, "{name}: the heap grew by {growth} bytes over 7 tokenizers");
    }
}
