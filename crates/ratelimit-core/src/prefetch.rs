//! A hint to the CPU to start loading a cache line: the one `unsafe` call of this crate.
//!
//! The memory store requests a key's bucket before it reads the clock and takes the shard's lock,
//! so that on a table larger than the cache the memory's latency overlaps that work instead of
//! following it (on a million keys, checks took 103–107 ns against 140–186 without it; see
//! `docs/benchmarks.md`). A plain load in its place does not help: the lock's atomic instruction
//! waits for it.
//!
//! Stable Rust has no safe prefetch: `std::hint::prefetch_read` is unstable, and the x86-64
//! intrinsic may only be called in `unsafe` code from a function without its target feature.

#![allow(unsafe_code)]

/// Asks for the cache line holding `p` to be loaded. `p` may be dangling or out of bounds: it is
/// never dereferenced, and a prefetch never faults. A no-op where there is no prefetch intrinsic
/// to call.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    // SAFETY: `_mm_prefetch` is safe to call wherever SSE is available, which the `cfg` above
    // guarantees (it is part of the x86-64 baseline); the prefetch instruction only hints the
    // cache and neither reads `p` into the program nor faults, whatever `p` points to.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = p;
}
