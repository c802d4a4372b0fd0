//! What the routing examples share (`#[path]`-included by routing_bench.rs and routing_scale.rs): an
//! allocator that counts live bytes (index memory), the synthetic prompts (shared system prefixes, unique
//! tails), their KV `Stored` batches, and percentiles.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use prost::Message;

use extproc_core::pb::kv_events as pb;

pub const BLOCK: usize = 16;
pub const SYSTEM_PROMPTS: u32 = 256;
pub const SYSTEM_BLOCKS: u32 = 64; // 1,024-token shared prefixes
pub const TAIL_BLOCKS: u32 = 64; // 1,024 tokens per user turn

pub struct Counting;
pub static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

pub struct Lcg(pub u64);
impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

pub fn tokens(system: u32, user: u32) -> Vec<u32> {
    let mut t: Vec<u32> = (0..SYSTEM_BLOCKS as usize * BLOCK)
        .map(|i| system * 1_000_003 + i as u32)
        .collect();
    t.extend((0..TAIL_BLOCKS as usize * BLOCK).map(|i| 0x4000_0000 + user * 7919 + i as u32));
    t
}

pub fn stored(seq: u64, t: &[u32], engine_hash_base: i64) -> Vec<u8> {
    let blocks = t
        .chunks_exact(BLOCK)
        .enumerate()
        .map(|(k, b)| pb::KvBlock {
            block_hash: engine_hash_base + k as i64,
            token_ids: b.to_vec(),
            block_size: BLOCK as i32,
            ..Default::default()
        })
        .collect();
    let ev = pb::KvCacheEvent {
        event_id: 0,
        data: Some(pb::kv_cache_event::Data::Stored(pb::KvBlocksStored {
            blocks,
            ..Default::default()
        })),
    };
    pb::KvEventBatch {
        sequence_number: seq,
        events: vec![ev],
        ..Default::default()
    }
    .encode_to_vec()
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}
